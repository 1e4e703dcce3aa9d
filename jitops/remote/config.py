"""Settings of the remote tier, read once from the environment.

Imports only the stdlib and ``jitops.errors``. This is the one reader of the
``JITOPS_REMOTE_*`` variables; when the package gets one ``Settings`` type,
these fields move there unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

CONNECT_TIMEOUT = 2.0  # seconds: a store that does not answer costs this once per process
OP_TIMEOUT = 30.0  # seconds: one blob up or down
LEASE_SECONDS = 30.0  # a builder renews every third of this; a dead builder's lease lapses after it
FAILURE_SECONDS = 300.0  # a failed build's record makes waiters fail at once, then lapses so a fixed toolchain retries


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    mode: str  # "read", "write" (warns without a signing key) or "auto" (unset: write iff a signing key is found)
    trusted_keys: str | None  # JITOPS_REMOTE_TRUSTED_KEYS: key texts and/or files of them
    signing_key: str | None  # JITOPS_REMOTE_SIGNING_KEY: private key file (default: the user's config dir)
    config_dir: str | None  # JITOPS_CONFIG_DIR, else platformdirs' user config dir
    connect_timeout: float = CONNECT_TIMEOUT
    op_timeout: float = OP_TIMEOUT
    lease_seconds: float = LEASE_SECONDS
    failure_seconds: float = FAILURE_SECONDS


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} is not a positive number of seconds. Fix: set e.g. {default:g}, or unset it")
    return value


def remote_settings(environ: Mapping[str, str] | None = None) -> RemoteSettings | None:
    """The tier's settings, or None when ``JITOPS_REMOTE_CACHE`` is unset (the tier is off)."""
    env = os.environ if environ is None else environ
    url = env.get("JITOPS_REMOTE_CACHE", "").strip()
    if not url:
        return None
    mode = env.get("JITOPS_REMOTE_CACHE_MODE", "").strip().lower() or "auto"
    if mode not in ("read", "write", "auto"):
        raise ConfigError(f"JITOPS_REMOTE_CACHE_MODE={mode!r} is not a mode. Fix: set it to read or write")
    return RemoteSettings(
        url=url,
        mode=mode,
        trusted_keys=env.get("JITOPS_REMOTE_TRUSTED_KEYS") or None,
        signing_key=env.get("JITOPS_REMOTE_SIGNING_KEY") or None,
        config_dir=env.get("JITOPS_CONFIG_DIR") or None,
        connect_timeout=_seconds(env, "JITOPS_REMOTE_CONNECT_TIMEOUT", CONNECT_TIMEOUT),
        op_timeout=_seconds(env, "JITOPS_REMOTE_TIMEOUT", OP_TIMEOUT),
        lease_seconds=_seconds(env, "JITOPS_REMOTE_LEASE_SECONDS", LEASE_SECONDS),
        failure_seconds=_seconds(env, "JITOPS_REMOTE_FAILURE_SECONDS", FAILURE_SECONDS),
    )


def config_dir(settings: RemoteSettings | None) -> str:
    """Where ``jitops cache keygen`` writes the key pair, and where it is looked for."""
    if settings is not None and settings.config_dir:
        return os.path.abspath(os.path.expanduser(settings.config_dir))
    override = os.environ.get("JITOPS_CONFIG_DIR")
    if override:
        return os.path.abspath(os.path.expanduser(override))
    import platformdirs

    return platformdirs.user_config_dir("jitops", appauthor=False)
