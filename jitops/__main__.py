"""``python -m jitops``: the jitops command.

Imports: cli.
"""

import sys

from .cli import main

sys.exit(main())
