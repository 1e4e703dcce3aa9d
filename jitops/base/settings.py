"""Settings: every ``JITOPS_*`` variable, read and parsed in one place.

``Settings.from_env(os.environ)`` is called once at each public entry point
(``get``, ``load``, ``load_inline``, each CLI command) and the frozen value is
passed down. No other module reads ``JITOPS_*`` variables, and nothing writes
``os.environ``: a caller that wants another behaviour passes
``dataclasses.replace(settings, progress=False)``.

To add a setting: one field, one line in :meth:`Settings.from_env` using the
parsers below (each names the variable, its value and the fix on bad input),
and one row in :data:`SETTINGS`, which ``jitops doctor`` and the docs' settings
reference are made from.

Imports: errors, record and userdirs only (the default cache and state roots); units lazily (a size
set).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from ..errors import ConfigError
from .record import record
from .userdirs import user_dir

# Every variable Settings reads, in display order: (name, type, default, meaning). This table is the
# one description of each: `jitops doctor` lists the ones set, and the docs' settings reference is
# generated from it (tests/test_docs_coverage.py fails on a variable read here but missing from it).
# Plain tuples of strings: they cost nothing at import, which the warm path pays.
SETTINGS: tuple[tuple[str, str, str, str], ...] = (
    (
        "JITOPS_CACHE_DIR",
        "path",
        "the user cache dir (`$XDG_CACHE_HOME/jitops`, else `~/.cache/jitops` on Linux)",
        "Root of the build cache. Read at each call, never at import.",
    ),
    (
        "JITOPS_OFFLINE",
        "on/off",
        "off",
        "Never build and never write the cache; a missing entry raises `OfflineMiss`.",
    ),
    (
        "JITOPS_FALLBACK",
        "on/off",
        "off",
        "When an op cannot be built here, return its pure-PyTorch reference (one warning per op).",
    ),
    (
        "JITOPS_STRICT",
        "on/off",
        "off",
        "When the cache is unusable, raise `CacheError` instead of building into a private "
        "temporary cache.",
    ),
    (
        "JITOPS_BUILDER",
        "`real` or `fake`",
        "`real`",
        "`fake` is the test suite's builder: a tiny library made without a compiler.",
    ),
    (
        "JITOPS_LOCK_TIMEOUT",
        "seconds (0 to 86400)",
        "unset: wait as long as the other build takes",
        "How long to wait for another process building the same entry before `LockTimeout`.",
    ),
    (
        "JITOPS_PROGRESS",
        "on/off",
        "unset: a live line on a terminal or in Jupyter, nothing otherwise",
        "Force the build progress display on or off.",
    ),
    (
        "JITOPS_FAKE_BUILD_SECONDS",
        "seconds (0 to 86400)",
        "0",
        "Stretches a fake build (`JITOPS_BUILDER=fake`), for the tests of kills and races.",
    ),
    (
        "MAX_JOBS",
        "whole number (1 to 4096)",
        "from the cores and the free memory",
        "Parallel compiles of one build, as torch's loader reads it.",
    ),
    (
        "JITOPS_PCH",
        "on/off",
        "on",
        "Precompile a user library's leading `#include` lines into the cache and reuse them.",
    ),
    (
        "JITOPS_LEAN_EXTENSION_H",
        "on/off",
        "on",
        "Compile a `JITOPS_LIBRARY` file that includes `<torch/extension.h>` but uses no Python "
        "API against a lean stand-in for that header first.",
    ),
    (
        "JITOPS_PCH_BACKGROUND",
        "on/off",
        "on",
        "Build a precompiled header in a detached low-priority process after the build returns; "
        "off: beside the build's compiles, which then wait for it.",
    ),
    (
        "JITOPS_PCH_PRESSURE",
        "fraction (0 to 1)",
        "0.25",
        "A background precompiled header starts only where, during the build that wants it, "
        "programs waited for a CPU less than this share of the time (Linux's CPU pressure; "
        "where the system has none, it always starts); `1`: always. A later build tries again.",
    ),
    (
        "JITOPS_PCH_MAX_SIZE",
        "size (`2G`, `500M`, bytes; `0`: no bound)",
        "`1G`",
        "Bound on precompiled headers plus per-file objects; the least recently used go first "
        "after each build. Entries are never removed by it.",
    ),
    (
        "JITOPS_STATE_DIR",
        "path",
        "the user state dir (`$XDG_STATE_HOME/jitops`, else `~/.local/state/jitops` on Linux)",
        "Per-user state that outlives cache roots: toolchain verdicts, verified stamps, "
        "remembered calls.",
    ),
    (
        "JITOPS_FREEZE",
        "`error`, `warn` or `0`",
        "off",
        "Frozen mode: a use that would build raises `FrozenError` (`error`) or builds and warns "
        "once per library (`warn`). `jitops.freeze()` / `unfreeze()` win over it.",
    ),
    (
        "JITOPS_REQUIRE_SIGNED",
        "on/off",
        "off",
        "Load bundle entries, and import archive entries, only when signed by a trusted key.",
    ),
    (
        "JITOPS_REMOTE_CACHE",
        "URL (`redis://`, `s3://`, `file://`)",
        "unset: no remote tier",
        "A second cache tier shared by several machines.",
    ),
    (
        "JITOPS_REMOTE_CACHE_MODE",
        "`read`, `write` or `auto`",
        "`auto`",
        "`auto` uploads when a signing key is found; `read` never uploads nor takes leases; "
        "`write` warns once when there is no key.",
    ),
    (
        "JITOPS_REMOTE_TRUSTED_KEYS",
        "comma-separated `ed25519:...` keys or files of them",
        "unset: only your own key pair in the config dir",
        "Public keys whose signatures make a downloaded, imported or bundled entry trusted.",
    ),
    (
        "JITOPS_REMOTE_SIGNING_KEY",
        "path",
        "`signing.key` in the config dir",
        "The private key that signs uploads, exports and signed bundles.",
    ),
    (
        "JITOPS_CONFIG_DIR",
        "path",
        "the user config dir (`$XDG_CONFIG_HOME/jitops`, else `~/.config/jitops` on Linux)",
        "Where `jitops cache keygen` writes the key pair.",
    ),
    (
        "JITOPS_REMOTE_CONNECT_TIMEOUT",
        "seconds (more than 0, at most 86400)",
        "2 (10 for a torchrun job's store)",
        "Connecting to a store; after a failure the tier is off for the rest of the process.",
    ),
    (
        "JITOPS_REMOTE_TIMEOUT",
        "seconds (more than 0, at most 86400)",
        "30",
        "Wall-clock bound on one store operation (one entry up or down).",
    ),
    (
        "JITOPS_REMOTE_LEASE_SECONDS",
        "seconds (more than 0, at most 86400)",
        "30",
        "A builder's lease in a shared store lapses this long after its holder stops renewing it.",
    ),
    (
        "JITOPS_REMOTE_FAILURE_SECONDS",
        "seconds (more than 0, at most 86400)",
        "300",
        "How long a failed build's record stops other nodes from building the same entry.",
    ),
    (
        "JITOPS_DISTRIBUTED",
        "on/off or `signed`",
        "on (idle outside a torchrun job)",
        "Use a torchrun job's own c10d store as a cache tier; `signed` requires trusted "
        "signatures on what it serves.",
    ),
    (
        "JITOPS_HOST_ID",
        "text",
        "the hostname",
        "The node identity `jitops.distributed.warm` groups ranks by.",
    ),
)
VARIABLES = tuple(row[0] for row in SETTINGS)
BUILDERS = ("real", "fake")
# JITOPS_FREEZE / jitops.freeze(): a build raises FrozenError, or builds and warns
FREEZE_MODES = (
    "error",
    "warn",
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

T = TypeVar("T")


def _bad(name: str, raw: str, expected: str, fix: str) -> ConfigError:
    # one short line: the variable, its value (cut), what was expected, the fix
    shown = repr(raw) if len(repr(raw)) <= 80 else repr(raw)[:77] + "..."
    return ConfigError(f"{name}={shown} is not {expected}. Fix: {fix}")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return (
        _optional(
            env, name, _progress, "an on/off value", f"set {name}=1 to turn it on, or unset it"
        )
        or False
    )


def _optional(
    env: Mapping[str, str], name: str, parse: Callable[[str], T], expected: str, fix: str
) -> T | None:
    raw = env.get(name, "")
    if not raw.strip():
        return None
    try:
        return parse(raw.strip())
    except ValueError:
        raise _bad(name, raw, expected, fix) from None


def _seconds(text: str) -> float:
    if (value := float(text)) != value:  # NaN
        raise ValueError(text)
    return value


# Every wait and every timeout is bounded (SECURITY.md): a seconds setting is finite, positive and
# at most a day.
MAX_SECONDS = 86400.0


def _bounded_seconds(
    env: Mapping[str, str], name: str, default: float | None, *, zero: bool = False
) -> float | None:
    """The one parser of a seconds setting: ``default`` when unset; ConfigError naming variable, value, range, fix."""
    low = "0" if zero else "more than 0"
    expected = f"a number of seconds ({low} to {MAX_SECONDS:g})"
    fix = (
        f"set e.g. {default:g}, or unset it" if default is not None else "set e.g. 600, or unset it"
    )
    value = _optional(env, name, _seconds, expected, fix)
    if value is None:
        return default
    if not (value >= 0 if zero else value > 0) or value > MAX_SECONDS:  # also inf
        raise _bad(name, env[name], expected, fix)
    return value


def _jobs(text: str) -> int:
    # A whole number of parallel compiles; junk is a ConfigError rather than silently ignored.
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 4096):
        raise ValueError(text)
    return int(text)


def _progress(text: str) -> bool:
    if text.lower() not in (*_TRUE, *_FALSE):
        raise ValueError(text)
    return text.lower() in _TRUE


def _freeze(text: str) -> str | None:
    if text.lower() not in (*FREEZE_MODES, *_FALSE):
        raise ValueError(text)
    return text.lower() if text.lower() in FREEZE_MODES else None


def _fraction(text: str) -> float:
    if not 0.0 <= (value := float(text)) <= 1.0:  # NaN fails too
        raise ValueError(text)
    return value


def _size(text: str) -> int:  # 1G, 500M, 1.5GiB or a byte count (binary units); 0: no cap
    from .units import parse_size  # only when a size is set: not on every warm load

    return parse_size(text)


@record
class RemoteSettings:
    """The remote tier's variables; present only when ``JITOPS_REMOTE_CACHE`` is set."""

    url: str  # JITOPS_REMOTE_CACHE
    # JITOPS_REMOTE_CACHE_MODE: "read", "write" (warns without a key) or "auto" (write iff a key is
    # found)
    mode: str
    trusted_keys: str | None  # JITOPS_REMOTE_TRUSTED_KEYS: key texts and/or files of them
    # JITOPS_REMOTE_SIGNING_KEY: private key file (default: in the config dir)
    signing_key: str | None
    # JITOPS_CONFIG_DIR, else platformdirs' user config dir (jitops.remote.config)
    config_dir: str | None
    # JITOPS_REMOTE_CONNECT_TIMEOUT: a silent store costs this once per process
    connect_timeout: float = 2.0
    op_timeout: float = 30.0  # JITOPS_REMOTE_TIMEOUT: one blob up or down
    # JITOPS_REMOTE_LEASE_SECONDS: renewed every third; a dead builder's lapses
    lease_seconds: float = 30.0
    # JITOPS_REMOTE_FAILURE_SECONDS: how long a failed build's record stops waiters
    failure_seconds: float = 300.0


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    # never None, never 0 (it must be more than 0)
    return _bounded_seconds(env, name, default) or default


def _tier(env: Mapping[str, str], url: str, mode: str, connect_timeout: float) -> RemoteSettings:
    """A tier's settings: the remote cache's, or the job store's (which shares its keys, timeouts and lease)."""
    d = RemoteSettings
    return RemoteSettings(
        url=url,
        mode=mode,
        trusted_keys=env.get("JITOPS_REMOTE_TRUSTED_KEYS") or None,
        signing_key=env.get("JITOPS_REMOTE_SIGNING_KEY") or None,
        config_dir=env.get("JITOPS_CONFIG_DIR") or None,
        connect_timeout=_positive(env, "JITOPS_REMOTE_CONNECT_TIMEOUT", connect_timeout),
        op_timeout=_positive(env, "JITOPS_REMOTE_TIMEOUT", d.op_timeout),
        lease_seconds=_positive(env, "JITOPS_REMOTE_LEASE_SECONDS", d.lease_seconds),
        failure_seconds=_positive(env, "JITOPS_REMOTE_FAILURE_SECONDS", d.failure_seconds),
    )


def remote_settings(environ: Mapping[str, str] | None = None) -> RemoteSettings | None:
    """The remote tier's settings, or None when ``JITOPS_REMOTE_CACHE`` is unset (the tier is off)."""
    env = os.environ if environ is None else environ
    url = env.get("JITOPS_REMOTE_CACHE", "").strip()
    if not url:
        return None
    mode = env.get("JITOPS_REMOTE_CACHE_MODE", "").strip().lower() or "auto"
    if mode not in ("read", "write", "auto"):
        raise _bad(
            "JITOPS_REMOTE_CACHE_MODE", mode, "a mode", "set it to read or write, or unset it"
        )
    return _tier(env, url, mode, RemoteSettings.connect_timeout)


@record
class DistributedSettings:
    """The job's c10d store as a cache tier; None when ``JITOPS_DISTRIBUTED=0``. Read here because
    only this module reads the environment: torchrun's
    ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``/``TORCHELASTIC_RESTART_COUNT``, and the
    remote tier's timeouts, lease and failure seconds and key settings, which apply to the job store
    too (``tier``; its ``url`` names the job store in messages)."""

    # JITOPS_DISTRIBUTED=signed: accept only entries signed by a trusted key (the remote tier's
    # rules)
    signed: bool
    # MASTER_ADDR (with MASTER_PORT and WORLD_SIZE > 1: connect a TCPStore client)
    master_addr: str | None
    master_port: int | None  # MASTER_PORT
    world_size: int  # WORLD_SIZE (1 when unset)
    rank: int  # RANK (0 when unset): this process's rank for `distributed.warm` without a group
    # JITOPS_HOST_ID: which ranks share a node for `distributed.warm`; None: the hostname
    host_id: str | None
    tier: RemoteSettings  # the tier's settings, url "c10d://MASTER_ADDR:MASTER_PORT"
    # TORCHELASTIC_RESTART_COUNT: torchrun's restart number (the agent's store outlives attempts)
    attempt: int = 0

    def in_job(self) -> bool:
        """torchrun's variables name a store of a job of 2+ ranks, or a default process group is up (peeks at
        ``sys.modules``: never imports ``torch.distributed``)."""
        if self.master_addr and self.master_port and self.world_size > 1:
            return True
        import sys

        dist = sys.modules.get("torch.distributed")
        return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _whole(raw: str) -> int | None:
    """torchrun's numbers, read leniently: they are not jitops' variables, and junk means "not in a job"."""
    raw = raw.strip()
    return int(raw) if raw.isascii() and raw.isdigit() else None


def distributed_settings(env: Mapping[str, str]) -> DistributedSettings | None:
    raw = env.get("JITOPS_DISTRIBUTED", "")
    word = raw.strip().lower()
    if word in ("0", "false", "no", "off"):
        return None
    if word not in ("", "1", "true", "yes", "on", "signed"):
        raise _bad(
            "JITOPS_DISTRIBUTED",
            raw,
            "an on/off value or `signed`",
            "unset it (on under torchrun), set 0 to turn the job store tier off, or `signed` to require signatures",
        )
    port, world = _whole(env.get("MASTER_PORT", "")), _whole(env.get("WORLD_SIZE", "")) or 1
    if port is not None and not 0 < port < 65536:
        # no TCP port: not a job's store (torch.distributed would refuse it with a raw TypeError)
        port = None
    addr = env.get("MASTER_ADDR", "").strip() or None
    tier = _tier(
        env, f"c10d://{addr}:{port}" if addr and port else "c10d://default-store", "write", 10.0
    )
    return DistributedSettings(
        signed=word == "signed",
        master_addr=addr,
        master_port=port,
        world_size=world,
        rank=_whole(env.get("RANK", "")) or 0,
        host_id=env.get("JITOPS_HOST_ID", "").strip() or None,
        tier=tier,
        attempt=_whole(env.get("TORCHELASTIC_RESTART_COUNT", "")) or 0,
    )


NOT_IN_A_JOB = distributed_settings({})  # the default: on, and idle until a job is found


@record
class Settings:
    """What the environment asks of jitops; parsed once, passed down."""

    cache_dir: Path | None = None  # JITOPS_CACHE_DIR, absolute; None: platformdirs' user cache dir
    offline: bool = False  # JITOPS_OFFLINE: never build, never write the cache
    fallback: bool = False  # JITOPS_FALLBACK: the pure-PyTorch reference when an op cannot be built
    strict: bool = False  # JITOPS_STRICT: no private temporary cache when the cache is unusable
    # JITOPS_LOCK_TIMEOUT seconds; None: wait as long as the build takes
    lock_timeout: float | None = None
    # JITOPS_PROGRESS: force the build progress line on/off; None: auto
    progress: bool | None = None
    jobs: int | None = None  # MAX_JOBS: parallel compiles; None: cores capped by memory
    # JITOPS_BUILDER: "fake" is the test seam (a tiny real library, no compiler)
    builder: str = "real"
    # JITOPS_FAKE_BUILD_SECONDS: stretches a fake build (kill/race tests)
    fake_build_seconds: float = 0.0
    # JITOPS_REMOTE_*: the remote tier; None: off, nothing of it imported
    remote: RemoteSettings | None = None
    # JITOPS_CONFIG_DIR: where `jitops cache keygen` keeps the key pair
    config_dir: str | None = None
    # JITOPS_DISTRIBUTED: the job's c10d store as a tier
    distributed: DistributedSettings | None = NOT_IN_A_JOB
    # JITOPS_PCH (on unless 0): precompile each file's header prefix into the cache
    pch: bool = True
    # JITOPS_LEAN_EXTENSION_H (on unless 0): torch/extension.h's stand-in (tubuild)
    lean_extension_h: bool = True
    # JITOPS_PCH_BACKGROUND (on unless 0): PCHs built after the build, detached (pch_bg)
    pch_background: bool = True
    # JITOPS_PCH_MAX_SIZE: cap on PCHs + per-file objects, LRU after builds; 0: none
    pch_max_size: int = 1 << 30
    # JITOPS_PCH_PRESSURE: the CPU pressure during a build above which its background PCH waits
    pch_pressure: float = 0.25
    # JITOPS_STATE_DIR, absolute; None: platformdirs' user state dir (self-check verdicts)
    state_dir: Path | None = None
    # JITOPS_FREEZE: "error"/"warn" after warm-up (build.freeze; jitops.freeze() wins); None: off
    freeze: str | None = None
    # JITOPS_REQUIRE_SIGNED: bundles and imported archives only if signed by a trusted key
    require_signed: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Parse the variables; a value jitops cannot use raises ConfigError naming it and the fix."""
        env = os.environ if environ is None else environ
        timeout = _bounded_seconds(env, "JITOPS_LOCK_TIMEOUT", None, zero=True)
        builder = env.get("JITOPS_BUILDER", "").strip() or "real"
        if builder not in BUILDERS:
            raise _bad(
                "JITOPS_BUILDER",
                env["JITOPS_BUILDER"],
                "a builder",
                f"set it to one of {list(BUILDERS)} or unset it",
            )
        cap = _optional(
            env,
            "JITOPS_PCH_MAX_SIZE",
            _size,
            "a size such as 2G, 500M or 0 (no cap)",
            "set e.g. JITOPS_PCH_MAX_SIZE=2G, or unset it for the default 1G",
        )
        pressure = _optional(
            env,
            "JITOPS_PCH_PRESSURE",
            _fraction,
            "a fraction from 0 to 1",
            "set e.g. JITOPS_PCH_PRESSURE=0.25, 1 to always start background PCHs, or unset it",
        )
        return cls(
            cache_dir=_cache_dir(env.get("JITOPS_CACHE_DIR", "")),
            offline=_flag(env, "JITOPS_OFFLINE"),
            fallback=_flag(env, "JITOPS_FALLBACK"),
            strict=_flag(env, "JITOPS_STRICT"),
            lock_timeout=timeout,
            progress=_optional(
                env,
                "JITOPS_PROGRESS",
                _progress,
                "0 or 1",
                "set JITOPS_PROGRESS=0 to hide the build progress line, 1 to force it, or unset it",
            ),
            jobs=_optional(
                env,
                "MAX_JOBS",
                _jobs,
                "a number of parallel compiles (1 to 4096)",
                "set e.g. MAX_JOBS=4, or unset it to size builds from cores and free memory",
            ),
            builder=builder,
            fake_build_seconds=_bounded_seconds(env, "JITOPS_FAKE_BUILD_SECONDS", 0.0, zero=True)
            or 0.0,
            remote=remote_settings(env),
            config_dir=env.get("JITOPS_CONFIG_DIR") or None,
            distributed=distributed_settings(env),
            pch=_on_unless_off(env, "JITOPS_PCH"),
            lean_extension_h=_on_unless_off(env, "JITOPS_LEAN_EXTENSION_H"),
            state_dir=_cache_dir(env.get("JITOPS_STATE_DIR", "")),
            pch_background=_on_unless_off(env, "JITOPS_PCH_BACKGROUND"),
            pch_max_size=1 << 30 if cap is None else cap,
            pch_pressure=0.25 if pressure is None else pressure,
            freeze=_optional(
                env,
                "JITOPS_FREEZE",
                _freeze,
                "a freeze mode (error, warn, or 0 for off)",
                "set JITOPS_FREEZE=error (a build raises FrozenError) or warn (builds, warns once per op), or unset it",
            ),
            require_signed=_flag(env, "JITOPS_REQUIRE_SIGNED"),
        )

    def cache_root(self) -> Path:
        """The cache root these settings name: JITOPS_CACHE_DIR, else the user cache dir."""
        if self.cache_dir is not None:
            return self.cache_dir
        return Path(user_dir("cache"))

    def state_root(self) -> Path:
        """Per-user state that outlives cache roots (self-check verdicts): JITOPS_STATE_DIR, else the user state dir."""
        if self.state_dir is not None:
            return self.state_dir
        return Path(user_dir("state"))

    def shown(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """``NAME=value`` for each variable of :data:`VARIABLES` that is set (for ``doctor``)."""
        env = os.environ if environ is None else environ
        return [f"{k}={env[k]}" for k in VARIABLES if env.get(k)]


def _on_unless_off(env: Mapping[str, str], name: str) -> bool:
    """A flag that is on when unset or empty (``0``/``false``/... turn it off)."""
    return _flag(env, name) if env.get(name, "").strip() else True


def _cache_dir(raw: str) -> Path | None:
    return Path(os.path.abspath(os.path.expanduser(raw))) if raw else None
