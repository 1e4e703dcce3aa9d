"""The user's cache, state and config folders for ``jitops``, as platformdirs names them, without importing it
on the common path.

Every warm load needs the cache root and the state root (stamps), and importing platformdirs costs ~3-4 ms
here: about half of a stable-ABI kernel's whole warm load. On Linux with an absolute ``$HOME`` (and no
Android markers) platformdirs' answer is the XDG rule: ``$XDG_<KIND>_HOME/jitops`` when that variable holds an
absolute path, else ``$HOME/<default>/jitops``. That case is answered here; every other one (another OS, no
or a relative ``HOME``, Android) asks platformdirs itself. ``tests/test_userdirs.py`` holds this rule to the
installed platformdirs, so a change in its answers fails there instead of splitting a user's folders.

Imports: nothing of jitops (platformdirs, lazily).
"""

from __future__ import annotations

import os
import posixpath
import sys

APP = "jitops"
_XDG = {
    "cache": ("XDG_CACHE_HOME", ".cache"),
    "state": ("XDG_STATE_HOME", ".local/state"),
    "config": ("XDG_CONFIG_HOME", ".config"),
}


def user_dir(kind: str) -> str:
    """platformdirs' ``user_<kind>_dir("jitops", appauthor=False)`` for kind ``cache``, ``state`` or ``config``."""
    var, default = _XDG[kind]
    home = os.environ.get("HOME", "")
    if sys.platform == "linux" and posixpath.isabs(home) and not _android():
        base = os.environ.get(var, "")
        return posixpath.join(base if posixpath.isabs(base) else posixpath.join(home, default), APP)
    import platformdirs

    return str(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))


def _android() -> bool:
    return (
        hasattr(sys, "getandroidapilevel")
        or "ANDROID_DATA" in os.environ
        or "ANDROID_ROOT" in os.environ
    )
