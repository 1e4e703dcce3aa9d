"""The remote tier's settings, as the package receives them.

The ``JITOPS_REMOTE_*`` and ``JITOPS_CONFIG_DIR`` variables are read by
``jitops.base.settings`` (the one reader of ``JITOPS_*``) into
``Settings.remote`` / ``Settings.config_dir``; this module re-exports that
type and says where the signing key pair lives: the user's *config* dir
(``JITOPS_CONFIG_DIR``, else platformdirs' ``user_config_dir("jitops")``, as base.userdirs answers it),
never the cache, which may be shared or wiped.

Imports: ``jitops.base.settings`` and ``jitops.base.userdirs`` only.
"""

from __future__ import annotations

import os

from ..base.settings import RemoteSettings, Settings, remote_settings

__all__ = ["RemoteSettings", "Settings", "config_dir", "for_keys", "remote_settings"]


def for_keys(settings: Settings) -> RemoteSettings:
    """The remote settings to find the key pair with, also when ``JITOPS_REMOTE_CACHE`` is unset (``keygen``)."""
    if settings.remote is not None:
        return settings.remote
    return RemoteSettings(
        url="", mode="read", trusted_keys=None, signing_key=None, config_dir=settings.config_dir
    )


def config_dir(settings: RemoteSettings | None) -> str:
    """Where ``jitops cache keygen`` writes the key pair, and where it is looked for."""
    if settings is not None and settings.config_dir:
        return os.path.abspath(os.path.expanduser(settings.config_dir))
    from ..base.userdirs import user_dir

    return user_dir("config")
