"""``python -m jitops``: the jitops command."""

import sys

from .cli import main

sys.exit(main())
