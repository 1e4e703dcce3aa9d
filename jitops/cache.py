"""``jitops.cache``: the kernel cache from Python, as ``jitops cache ...`` sees it.

Where the cache is ([`location`][jitops.cache.location]), what it holds
([`entries`][jitops.cache.entries]: frozen [`Entry`][jitops.cache.Entry] records), its size
([`size`][jitops.cache.size], [`info`][jitops.cache.info]) and the maintenance the commands do:
[`prune`][jitops.cache.prune] to a size budget or an age, [`clear`][jitops.cache.clear] (all, or one
op's library), [`verify`][jitops.cache.verify], [`export`][jitops.cache.export] and
[`import_`][jitops.cache.import_] archives, [`push`][jitops.cache.push] to and
[`pull`][jitops.cache.pull] from the remote tier. The ``jitops cache`` commands call these functions
and only print what they return, so the two never disagree. The work is the store's own
(``store.admin``, ``store.archive``, ``remote.commands``): the same checks, errors
([`JitopsError`][jitops.JitopsError] subclasses), lock respect and link safety. Settings
(``JITOPS_*``) are read when a function is called; a function that writes refuses under
``JITOPS_OFFLINE=1``.

Importing it starts nothing and reads no folder; only [`push`][jitops.cache.push] and
[`pull`][jitops.cache.pull] import torch (they plan entries for this machine). The warm
``jitops.get`` path never imports it.
"""

# Imports: errors, base.settings, base.units, spec.checks; lazily registry, store.admin,
# store.archive, store.cache, store.manifest, remote.archive_trust, remote.commands (push, pull, the
# remote listing), remote.origin; store.admin, store.cache, remote.commands (annotations).

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base.settings import Settings
from .base.units import parse_age, parse_size
from .errors import ArgumentError, ConfigError
from .spec import checks

if TYPE_CHECKING:
    from .remote.commands import Transferred
    from .store.admin import EntryInfo, Removal
    from .store.cache import Cache

__all__ = [
    "Entry",
    "Exported",
    "Imported",
    "Part",
    "Ref",
    "Removed",
    "Summary",
    "Verdict",
    "clear",
    "entries",
    "export",
    "import_",
    "info",
    "location",
    "prune",
    "pull",
    "push",
    "remote_entries",
    "size",
    "verify",
]


@dataclass(frozen=True)
class Entry:
    """One cache entry: an op library built for one target under one key.

    ``origin`` is ``"built"`` (built on this machine), ``"imported"`` (from an archive),
    ``"pulled"`` (the remote tier), ``"job-store"`` (a torchrun job's store) or ``"unknown"`` (its
    note cannot be read: never taken for a build here); ``source`` says from where. ``signed_by`` is
    the fingerprint of the key whose signature was checked when it came in (None: built here, which
    is signed only on export or push, or came unsigned). ``damaged``: its manifest is missing or
    unreadable (``verify`` checks the rest: key, size and sha256)."""

    op: str  # the op library's name (one library may export several ops)
    target: str  # e.g. cpu-avx2, cuda-sm90
    key: str
    size: int  # bytes
    last_use: float  # seconds since the epoch: last loaded, published or imported
    built_at: float | None  # None when damaged
    origin: str
    source: str
    signed_by: str | None
    damaged: bool
    path: Path

    @property
    def signed(self) -> bool:
        return self.signed_by is not None


@dataclass(frozen=True)
class Ref:
    """An entry named by op library, target and key (what an archive or a store holds). ``inputs``:
    in a remote store, the name of the set of inputs an entry stored beside the first was built
    from."""

    op: str
    target: str
    key: str
    inputs: str = ""


@dataclass(frozen=True)
class Part:
    """A per-file object or a precompiled header: rebuildable, bounded with the entries by
    ``prune``."""

    kind: str  # "object" or "pch"
    label: str
    size: int
    last_use: float


@dataclass(frozen=True)
class Removed:
    """What [`prune`][jitops.cache.prune] or [`clear`][jitops.cache.clear] removed, what it kept
    because another process was building or using it, and the bytes kept (entries, objects and
    PCHs)."""

    removed: tuple[Entry, ...]
    busy: tuple[Entry, ...]
    parts_removed: tuple[Part, ...]
    parts_busy: tuple[Part, ...]
    kept: int

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.removed) + sum(p.size for p in self.parts_removed)


@dataclass(frozen=True)
class Verdict:
    """One entry as [`verify`][jitops.cache.verify] found it: ``problem`` None when sound;
    ``removed`` with ``remove=True``."""

    entry: Entry
    problem: str | None
    removed: bool

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Exported:
    """What [`export`][jitops.cache.export] wrote: every entry, those signed with this machine's key
    (entries built here), the ones left out and why, and whether a signing key was found at all."""

    file: Path
    entries: tuple[Entry, ...]
    signed: tuple[Entry, ...]
    skipped: tuple[tuple[Entry, str], ...]
    signing_key: bool


@dataclass(frozen=True)
class Imported:
    """What [`import_`][jitops.cache.import_] did with each entry of an archive: published, already
    present, rejected (with why: never published), kept but built for another machine, taken
    unsigned; toolchain records added."""

    imported: tuple[Ref, ...]
    present: tuple[Ref, ...]
    rejected: tuple[tuple[str, str], ...]
    foreign: tuple[tuple[Ref, str], ...]
    unsigned: tuple[Ref, ...]
    records: int


@dataclass(frozen=True)
class Summary:
    """The cache at a glance (``jitops cache info``). ``size`` is what [`prune`][jitops.cache.prune]
    bounds (entries, objects, PCHs); ``total`` adds staging, logs, trash, inline sources, toolchain
    records and locks. ``kinds``: (kind, items, bytes) per folder; ``objects`` and ``pchs``: (count,
    bytes) of the per-file objects and of the precompiled headers themselves (without marks of
    prefixes only seen). ``parts_budget``: the cap on PCHs and objects kept after each build
    (``JITOPS_PCH_MAX_SIZE``; 0: none). Entries have no automatic budget."""

    location: Path
    entries: int
    size: int
    total: int
    kinds: tuple[tuple[str, int, int], ...]
    objects: tuple[int, int]
    pchs: tuple[int, int]
    parts_budget: int


# ------------------------------------------------------------------ reading


def location() -> Path:
    """The cache root this process uses: ``JITOPS_CACHE_DIR``, else the user's cache folder."""
    return Settings.from_env().cache_root()


def entries(op: str | None = None) -> list[Entry]:
    """Every entry (of ``op``'s library, every target), least recently used first."""
    from .store import admin

    cache = _cache(Settings.from_env())
    library = None if op is None else _library("jitops.cache.entries", op, cache)
    return [_entry(cache, e) for e in admin.entries(cache) if library in (None, e.library)]


def size() -> int:
    """Bytes of what [`prune`][jitops.cache.prune] bounds: entries, per-file objects and precompiled
    headers."""
    from .store import admin

    cache = _cache(Settings.from_env())
    parts = admin.cache_parts.all_parts(cache, time.time())
    return sum(e.size for e in admin.entries(cache)) + sum(p.size for p in parts)


def info() -> Summary:
    """Location, entry count, sizes by kind and the automatic budget
    ([`Summary`][jitops.cache.Summary])."""
    from .store import admin

    settings = Settings.from_env()
    cache = _cache(settings)
    infos = admin.entries(cache)
    parts = admin.cache_parts.all_parts(cache, time.time())
    kinds = tuple(admin.kind_sizes(cache, infos, parts))
    use = admin.cache_parts.usage(parts)
    return Summary(
        location=cache.root,
        entries=len(infos),
        size=sum(e.size for e in infos) + sum(p.size for p in parts),
        total=sum(n for _, _, n in kinds),
        kinds=kinds,
        objects=use["object"],
        pchs=use["pch"],
        parts_budget=settings.pch_max_size,
    )


def remote_entries() -> list[Ref]:
    """The entries the remote tier (``JITOPS_REMOTE_CACHE``) holds; ConfigError when none is set."""
    from .remote.commands import remote_entries as listed

    found, _, _ = listed(Settings.from_env())
    return [Ref(*e) for e in found]


# ------------------------------------------------------------------ maintenance


def prune(
    *,
    max_size: int | str | None = None,
    older_than: float | str | timedelta | None = None,
) -> Removed:
    """Evict least recently used entries, per-file objects and precompiled headers until what is
    left fits ``max_size`` (bytes, or a string such as ``"5GB"`` or ``"500MiB"``: binary units);
    ``older_than`` (seconds, a ``timedelta`` or a string such as ``"30d"``) also evicts what was
    unused that long. Damaged things go first; what another process is building or just used is kept
    (`Removed.busy`)."""
    func = "jitops.cache.prune"
    budget = _size_arg(func, max_size)
    age = _age_arg(func, older_than)
    if budget is None and age is None:
        raise ArgumentError(f"{func}() needs max_size= and/or older_than=, got neither")
    from .store import admin

    settings = _writes(func)
    cache = _cache(settings)
    known = _known(cache)
    return _removed(cache, admin.prune(cache, max_size=budget, older_than=age), known)


def clear(op: str | None = None) -> Removed:
    """Remove everything jitops put in the cache (entries, objects, PCHs, logs, toolchain records,
    trash), or with ``op`` only the entries of its library (every target). Entries being built are
    kept, and anything jitops did not put there is left alone; a link is removed as itself, never
    followed."""
    from .store import admin

    settings = _writes("jitops.cache.clear")
    cache = _cache(settings)
    library = None if op is None else _library("jitops.cache.clear", op, cache)
    known = _known(cache)
    return _removed(cache, admin.clear(cache, library), known)


def verify(op: str | None = None, *, remove: bool = False) -> list[Verdict]:
    """Re-check every entry (of ``op``'s library) completely: manifest, key, size and sha256.
    ``remove``: damaged entries are removed (not one a build holds), as ``jitops cache verify
    --remove``."""
    from .store import admin

    func = "jitops.cache.verify"
    checks.flag(func, "remove", remove)
    settings = _writes(func) if remove else Settings.from_env()
    cache = _cache(settings)
    library = None if op is None else _library(func, op, cache)
    known = _known(cache)
    return [
        Verdict(known.get(e.path) or _entry(cache, e), problem, removed)
        for e, problem, removed in admin.verify(cache, library, remove=remove)
    ]


def export(file: str | Path, ops: list[str] | None = None) -> Exported:
    """Write every entry (or those of ``ops``' libraries) to an archive (tar.gz). Entries built here
    are signed with this machine's key when there is one (``jitops cache keygen``); others go
    unsigned."""
    from .remote.archive_trust import archive_signer
    from .store import archive

    func = "jitops.cache.export"
    dest = Path(checks.path(func, "file", file))
    settings = Settings.from_env()
    cache = _cache(settings)
    libs = {_library(func, op, cache) for op in checks.strings(func, "ops", ops)} or None
    sign = archive_signer(settings, cache)
    signed: list[Any] = []

    def sign_built(info: EntryInfo, raw: bytes) -> Any:  # keeps what was signed: entries built here
        done = sign(info, raw)
        signed.extend([info] if done else [])
        return done

    exported, skipped = archive.export(
        cache, dest, libs, sign=sign_built if sign is not None else None
    )
    known = _known(cache)
    shown = lambda e: known.get(e.path) or _entry(cache, e)  # noqa: E731
    return Exported(
        dest,
        tuple(shown(e) for e in exported),
        tuple(shown(e) for e in signed),
        tuple((shown(e), why) for e, why in skipped),
        sign is not None,
    )


def import_(file: str | Path) -> Imported:
    """Add the entries of an archive written by [`export`][jitops.cache.export], each checked like a
    build first (signature against ``JITOPS_REMOTE_TRUSTED_KEYS``, manifest, key, size, sha256;
    links, special files and oversized members refuse the whole archive with a CacheError). Each is
    noted as imported."""
    from .remote.archive_trust import archive_trust, origin_noter
    from .store import archive

    func = "jitops.cache.import_"
    src = Path(checks.path(func, "file", file))
    settings = _writes(func)
    cache = _cache(settings)
    res = archive.import_archive(
        cache,
        src,
        verify=archive_trust(settings),
        note=origin_noter(cache, str(src.resolve())),
    )
    ref = lambda m: Ref(m.library, m.target, m.key)  # noqa: E731
    return Imported(
        tuple(ref(m) for m in res.imported),
        tuple(ref(m) for m in res.present),
        tuple(res.rejected),
        tuple((ref(m), why) for m, why in res.foreign),
        tuple(ref(m) for m in res.unsigned),
        res.records,
    )


def push(
    ops: list[str] | None = None,
    *,
    devices: list[str] | None = None,
    resign_foreign: list[str] | None = None,
) -> Transferred:
    """Sign and upload this machine's entries of ``ops`` (default: every known op) for ``devices``
    (default cpu) to ``JITOPS_REMOTE_CACHE``. Entries not built here go only when their op is named
    in ``resign_foreign``: your key then vouches for someone else's build."""
    from .remote import commands

    func = "jitops.cache.push"
    return commands.push(
        checks.strings(func, "ops", ops),
        checks.strings(func, "devices", devices) or None,
        checks.strings(func, "resign_foreign", resign_foreign),
    )


def pull(ops: list[str] | None = None, *, devices: list[str] | None = None) -> Transferred:
    """Fetch the entries of ``ops`` (default: every known op) for ``devices`` (default cpu) that are
    not here yet from ``JITOPS_REMOTE_CACHE``, each signature-checked and verified before it is
    published."""
    from .remote import commands

    func = "jitops.cache.pull"
    return commands.pull(
        checks.strings(func, "ops", ops), checks.strings(func, "devices", devices) or None
    )


# ------------------------------------------------------------------ helpers


def _cache(settings: Settings) -> Cache:
    from .store.cache import Cache

    return Cache(settings.cache_root())


def _writes(func: str) -> Settings:
    settings = Settings.from_env()
    if settings.offline:
        raise ConfigError(
            f"{func}() writes to the cache, and JITOPS_OFFLINE=1 forbids writing. "
            "Fix: run cache maintenance without JITOPS_OFFLINE"
        )
    return settings


def _library(func: str, op: object, cache: Cache) -> str:
    """The library holding op ``op``; a library's own name (one ``load_inline`` made, say) when the
    cache holds it; else UnknownOpError with the close matches."""
    from .registry import lookup, registry

    name = checks.op_name(func, op, "op")
    spec = registry().find(name)
    if spec is not None:
        return spec.name
    if cache.walkable(cache.library_dir(name)):
        return name
    return lookup(name).name  # raises UnknownOpError naming close matches, unless a package adds it


def _size_arg(func: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as e:
            raise ArgumentError(f"{func}(): `max_size` is an {e}") from None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ArgumentError(
        f"{func}(): `max_size` must be a byte count (int >= 0) or a size such as '5GB', "
        f"got {type(value).__name__} {checks.shown(value)}"
    )


def _age_arg(func: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        try:
            return parse_age(value)
        except ValueError as e:
            raise ArgumentError(f"{func}(): `older_than` is an {e}") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
    raise ArgumentError(
        f"{func}(): `older_than` must be seconds (a number >= 0), a timedelta or an age such "
        f"as '30d', got {type(value).__name__} {checks.shown(value)}"
    )


def _entry(cache: Cache, e: EntryInfo) -> Entry:
    origin, source = "built", ""
    signer: str | None = None
    if e.manifest is not None:
        from .remote.origin import origin_of
        from .store.manifest import Address

        address = Address(e.library, e.target, e.manifest.key)
        note = cache.origin_path(address)
        found: tuple[str, str, str | None] | None = None
        if not os.path.lexists(note):
            pass  # no note: built here
        elif not cache.walkable(note.parent):  # found through a link: never read, never trusted
            found = ("unknown", "its origin note's folder is a link", None)
        else:
            found = origin_of(cache, address)
        if found is not None:
            origin, source, signer = found
    return Entry(
        op=e.library,
        target=e.target,
        key=e.key,
        size=e.size,
        last_use=e.last_use,
        built_at=e.manifest.built_at if e.manifest is not None else None,
        origin=origin,
        source=source,
        signed_by=signer,
        damaged=e.manifest is None,
        path=e.path,
    )


def _known(cache: Cache) -> dict[Path, Entry]:
    """Every entry's record before a change, by path: an entry removed since keeps its origin."""
    from .store import admin

    return {e.path: _entry(cache, e) for e in admin.entries(cache)}


def _removed(cache: Cache, r: Removal, known: dict[Path, Entry]) -> Removed:
    shown = lambda e: known.get(e.path) or _entry(cache, e)  # noqa: E731
    part = lambda p: Part(p.kind, p.label, p.size, p.last_use)  # noqa: E731
    return Removed(
        tuple(shown(e) for e in r.removed),
        tuple(shown(e) for e in r.busy),
        tuple(part(p) for p in r.parts_removed),
        tuple(part(p) for p in r.parts_busy),
        r.kept_bytes,
    )
