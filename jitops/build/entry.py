"""What ``get()`` would do with a plan, answered once: :func:`entry_status` -> ``Hit | Compatible | Damaged | Miss``;
and :func:`ensure_entry`, which acts on it (lock, re-check, build, publish). ``get``, ``warm``, ``doctor``, ``explain``
and ``info`` all ask :func:`entry_status`. After a local miss, installed bundles (``store.bundles``, read once per
process, signatures checked by ``remote.archive_trust``) are asked the same way.

Imports: record, errors, key, manifest, plan, roots, settings, toolchain; bundles, remote.archive_trust and freeze
lazily (after a local miss; a hit's plan asks bundles only once they were read); cache for annotations (lock, publish,
selfcheck and stable lazily, on the miss path only; the ``remote`` tier too, only when ``settings.remote`` is set or
this process is in a torchrun job).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.record import record
from ..target import toolchain
from ..errors import BuildError, OfflineMiss, SourcesChanged, ToolchainError
from ..key import without_tools
from ..store.manifest import EntryProblem, Hit, Manifest
from ..plan import Plan
from ..store.roots import writable_cache
from ..base.settings import Settings

if TYPE_CHECKING:
    from ..store.bundles import BundleCache
    from ..store.cache import Cache
    from ..store.stamps import Stamps
    from .selfcheck import Pending

log = logging.getLogger("jitops")


@record
class Compatible:
    """No compiler here, and an entry equal to the plan in every ingredient but the toolchain."""

    path: Path
    manifest: Manifest
    plan: Plan  # the plan with that entry's toolchain and key


@record
class Damaged:
    """An entry with the plan's key must not be loaded (a cached one is set aside, a bundle's skipped): ``reason``."""

    reason: str


@record
class Miss:
    """Nothing cached for this plan: the next use builds it."""


EntryStatus = Hit | Compatible | Damaged | Miss


def find_compatible(
    plan: Plan, cache: Cache | None = None, refused: list[str] | None = None
) -> Compatible | None:
    """With no compiler here, an entry equal to the plan in every ingredient but the toolchain: how a slim container
    loads a cache warmed elsewhere (same torch, flags and sources). ``cache``: another one than the plan's (a
    bundle); ``refused`` collects why a candidate failed its check.
    """
    cache = plan.cache if cache is None else cache
    wanted = without_tools(plan.ingredients)
    parent = cache.target_dir(plan.spec.name, plan.target.name)
    if cache.root_problem() is not None or not os.path.isdir(parent):
        return None
    for entry in sorted(parent.iterdir()):
        m = cache.read_manifest(entry)
        if m is None or without_tools(m.ingredients) != wanted:
            continue
        try:
            verified = cache.verify(entry, m.key, plan.spec.name, plan.target.name)
            why = cache.stale(entry, verified, plan.spec.root, only_root=True)
            if why is not None:
                raise EntryProblem(why)
        except EntryProblem as e:
            if refused is not None:
                refused.append(str(e))
            continue
        return Compatible(
            entry, verified, dataclasses.replace(plan.with_tools_of(verified), cache=cache)
        )
    return None


def entry_status(plan: Plan) -> EntryStatus:
    """What the cache, then each installed bundle, holds for ``plan``. Reads and verifies; writes no entry."""
    found = plan.cache.lookup(plan.address, plan.spec.root)
    if isinstance(found, Hit):
        return found
    refused = [found.reason] if found.reason is not None else []
    # a hit asks no bundle: entry points read on a local miss only
    caches = installed_bundles(plan.cache.stamps)
    for bundle in caches:
        there = bundle.lookup(plan.address, plan.spec.root)
        if isinstance(there, Hit):
            return there
        if there.reason is not None:
            refused.append(f"the bundle {bundle.name} refused: {there.reason}")
    if plan.toolchain_error is not None:
        compatible = find_compatible(plan)
        for bundle in caches:
            if compatible is not None:
                return compatible
            problems: list[str] = []
            compatible = find_compatible(plan, bundle, problems)
            refused += [f"the bundle {bundle.name} refused: {p}" for p in problems]
        if compatible is not None:
            return compatible
    return Damaged("; ".join(refused)) if refused else Miss()


def installed_bundles(memo: Stamps | None = None) -> list[BundleCache]:
    """The installed bundles, each checking signatures against the trusted keys (and JITOPS_REQUIRE_SIGNED)."""
    from ..store import bundles

    def check(
        manifest: bytes, signature: Any
    ) -> None:  # each check reads the environment as it is then
        # else it passes: no import of remote
        if signature is not None or Settings.from_env().require_signed:
            from ..remote.archive_trust import archive_trust

            archive_trust(Settings.from_env())(manifest, signature)

    return bundles.installed(check, memo)


def _from(plan: Plan, path: Path) -> Plan:
    """``plan``, reading from the bundle that holds ``path`` if one does (the loader never writes into it)."""
    # not imported: no bundle was read, none holds it
    bundles = sys.modules.get("jitops.store.bundles")
    bundle = bundles.holding(path) if bundles is not None else None
    return plan if bundle is None else dataclasses.replace(plan, cache=bundle)


@record
class Entry:
    """A verified cache entry; ``plan`` is the plan whose key and cache it matches."""

    plan: Plan
    path: Path
    manifest: Manifest
    built: bool  # True if this call compiled it


def before_first_build(
    plan: Plan, settings: Settings, *, check_toolchain: bool = True
) -> Pending | None:
    """The one place that runs before this process builds anything for ``plan`` (the miss path only).

    Starts the toolchain self-check (C++ exceptions from its binaries must reach Python as RuntimeError) beside the
    build, which publishes, and the loader loads, only after its pass (``Pending``); ``check_toolchain=False`` defers
    it to the build (the remote tier: a remote hit builds nothing). A stable plan (no ninja, no check): its link stub."""
    if plan.ingredients.get("abi") == "stable":
        return importlib.import_module(".stable", __package__).before_build(plan)  # type: ignore[no-any-return]
    toolchain.find_ninja(plan.spec.name)  # a missing tool fails here, before any lock
    if not check_toolchain:
        return None
    from .selfcheck import start  # miss path only

    return start(plan, settings)


def _warm_hint(
    plan: Plan,
) -> str:  # how to fill the cache ahead of time: `jitops warm`, else one online call
    if plan.spec.exports:
        return f"run `jitops warm {plan.spec.exports[0]}`"
    return (
        f"call the same jitops.load / load_inline for {plan.spec.name!r} once without JITOPS_OFFLINE=1 "
        "(e.g. in the step that fills the cache)"
    )


def _why_missed(plan: Plan, status: EntryStatus) -> str:
    """Why nothing cached matched ``plan``, for FrozenError (the miss path only: it may verify other entries)."""
    if isinstance(status, Damaged):
        return "; ".join([f"its entry is damaged ({status.reason})", *_bundle_mismatches(plan)])
    # entry_status has looked without one
    other = find_compatible(plan) if plan.toolchain_error is None else None
    if other is not None:
        theirs, ours = (
            " / ".join(
                str(t.get("version"))
                for t in (i.get("compiler"), i.get("nvcc"))
                if isinstance(t, dict)
            )
            for i in (other.manifest.ingredients, plan.ingredients)
        )
        return (
            f"the toolchain differs: {other.path} was built with {theirs}, this machine has {ours}"
        )
    lib = plan.cache.library_dir(plan.spec.name)
    count = sum(1 for _ in lib.glob("*/*")) if lib.is_dir() else 0
    explain = (
        f" (`jitops explain {plan.spec.exports[0]}` names the differing ingredients)"
        if plan.spec.exports
        else ""
    )
    why = (
        f"no entry has this key: the {count} cached for {plan.spec.name!r} differ in sources, torch or flags{explain}"
        if count
        else f"no entry: nothing is cached for {plan.spec.name!r}"
    )
    if plan.toolchain_error is not None:
        why += (
            ", none differs only in the compiler, and this machine has no compiler to build with "
            f"({str(plan.toolchain_error).partition(' Fix: ')[0].rstrip('. ')})"
        )
    return "; ".join([why, *_bundle_mismatches(plan)])


SHOWN_BUNDLES = 3  # bundles named in one message; the rest counted
SHOWN_DIFFS = 3  # differing ingredients named per bundle; the rest counted
BUNDLE_ENTRIES = 64  # entries of one library read per bundle to find the nearest
# the ingredients a reader looks for first (a target stands for its ISA and flags)
_FIRST = ("target", "torch_version", "python_abi", "compiler.version", "nvcc.version")


def _leaves(theirs: Any, ours: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, their value, ours) of every leaf of two ingredient trees that differs."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return [
            leaf
            for k in sorted(set(theirs) | set(ours))
            for leaf in _leaves(
                theirs.get(k, "(absent)"), ours.get(k, "(absent)"), f"{prefix}.{k}" if prefix else k
            )
        ]
    return [] if theirs == ours else [(prefix, theirs, ours)]


def _short(value: Any) -> str:
    """A differing value in a few words: a digest by its start, a flag list by its words, cut to one short line."""
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12]
    return text if len(text) <= 40 else text[:37] + "..."


def _differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """How an entry's ingredients differ from the plan's, most telling first: 'target cpu-avx2 here cpu-avx512'."""
    leaves = _leaves(theirs, ours)
    if any(path == "target.name" for path, _, _ in leaves):
        # the target's name says it: not its ISA and device again
        leaves = [("target", t, o) for path, t, o in leaves if path == "target.name"] + [
            leaf for leaf in leaves if not leaf[0].startswith("target")
        ]
    leaves.sort(
        key=lambda leaf: (leaf[0] not in _FIRST, _FIRST.index(leaf[0]) if leaf[0] in _FIRST else 0)
    )
    return [f"{path} {_short(t)} here {_short(o)}" for path, t, o in leaves]


def _bundle_mismatches(plan: Plan) -> list[str]:
    """For each installed bundle holding entries of the plan's library, none of them usable: the bundle and how
    its nearest entry differs (bounded in length); what a miss says beside "nothing is cached"."""
    # with no compiler here, an entry differing only in its toolchain would have been used: compare
    # the rest
    mine = plan.ingredients if plan.toolchain_error is None else without_tools(plan.ingredients)
    ours = json.loads(json.dumps(mine))
    found: list[str] = []
    for bundle in installed_bundles(plan.cache.stamps):
        best: tuple[int, int, Path, list[str]] | None = None
        entries = sorted(bundle.library_dir(plan.spec.name).glob("*/*"))
        for path in entries[:BUNDLE_ENTRIES]:
            m = bundle.read_manifest(path)
            if m is None or not isinstance(m.ingredients, dict):
                continue
            theirs = m.ingredients if plan.toolchain_error is None else without_tools(m.ingredients)
            diffs = _differences(theirs, ours)
            rank = (len(diffs), int(m.target != plan.target.name))
            if best is None or rank < best[:2]:
                best = (*rank, path, diffs)
        # none read, or one with this very key (refused: a Damaged reason names it already)
        if best is None or not best[3]:
            continue
        diffs = best[3]
        more = f" and {len(diffs) - SHOWN_DIFFS} more" if len(diffs) > SHOWN_DIFFS else ""
        found.append(
            f"the bundle {bundle.name} holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} of "
            f"{plan.spec.name!r}, none with this key: the nearest ({best[2].parent.name}/{best[2].name[:12]}) "
            f"differs in {', '.join(diffs[:SHOWN_DIFFS])}{more}"
        )
    if len(found) > SHOWN_BUNDLES:
        found[SHOWN_BUNDLES:] = [f"{len(found) - SHOWN_BUNDLES} more bundles hold entries of it"]
    return found


def _frozen(plan: Plan, status: EntryStatus, settings: Settings) -> None:
    """Frozen mode, just before a build: FrozenError, or (warn mode) the first warning for this library."""
    if _freeze_mode(settings) is not None:
        from . import freeze  # a hit never asks

        what = f"op library {plan.spec.name!r} ({plan.target.name}, key {plan.key[:12]}) in the cache {plan.cache.root}"
        freeze.check(settings, plan.spec.name, what, _why_missed(plan, status), _warm_hint(plan))


def _freeze_mode(settings: Settings) -> str | None:
    from . import freeze  # the miss path only

    return freeze.mode(settings)[0]


SOURCE_ATTEMPTS = 3  # builds of one call whose sources keep changing under them, before BuildError


def ensure_entry(
    plan: Plan,
    *,
    offline: bool | None = None,
    jobs: int | None = None,
    settings: Settings | None = None,
) -> Entry:
    """Make sure a verified entry exists for ``plan``, building it if needed; loads nothing (``jitops warm`` uses it
    directly: a CUDA entry builds without a GPU). ``jobs`` caps parallel compiles (default: settings, cores, memory).
    """
    settings = Settings.from_env() if settings is None else settings
    offline = settings.offline if offline is None else offline
    status = entry_status(plan)
    if isinstance(status, Hit):
        return Entry(_from(plan, status.path), status.path, status.manifest, built=False)
    if isinstance(status, Compatible):
        return Entry(status.plan, status.path, status.manifest, built=False)
    if plan.toolchain_error is not None and not offline:
        if _freeze_mode(settings) == "error":
            # raises: nothing may be built here, which says more than "no compiler"
            _frozen(plan, status, settings)
        # an entry (a bundle's too) was refused, or a bundle holds only other machines' entries: say
        # why beside the missing compiler
        reasons = [status.reason] if isinstance(status, Damaged) else []
        reasons += _bundle_mismatches(plan)
        if reasons:
            head, fix, rest = str(plan.toolchain_error).partition(" Fix: ")
            raise ToolchainError(
                f"{head} No cached or bundled entry could be used instead: {'; '.join(reasons)}.{fix}{rest}"
            ) from plan.toolchain_error
        raise plan.toolchain_error
    if offline:
        why = f" ({status.reason})" if isinstance(status, Damaged) else ""
        raise OfflineMiss(
            f"JITOPS_OFFLINE=1 and the cache {plan.cache.root} has no usable entry for op library "
            f"{plan.spec.name!r} ({plan.target.name}, key {plan.key[:12]}){why}. Fix: {_warm_hint(plan)} "
            "with the same torch, compiler and flags, or unset JITOPS_OFFLINE"
        )
    # the job's store
    job = settings.distributed is not None and settings.distributed.in_job()
    remote = settings.remote is not None or job
    # the cache looked in, for frozen mode's message (a private one may replace it below)
    missed = plan
    frozen = _freeze_mode(settings) == "error"
    if frozen and not remote:
        _frozen(missed, status, settings)  # raises before any lock, self-check or build
    # frozen with a remote tier: only a fetch may answer, so nothing that runs a compiler (a stable
    # plan's link stub, the self-check) starts before build(), which raises first
    pending = None if frozen else before_first_build(plan, settings, check_toolchain=not remote)
    from .publish import build_and_publish  # miss path only: keeps the warm path's imports small

    cache = writable_cache(plan.cache, plan.what, settings)
    if cache is not plan.cache:
        plan = dataclasses.replace(plan, cache=cache)

    def build(plan: Plan) -> Manifest:
        nonlocal pending
        # here, not before: a fetch from a remote tier builds nothing
        _frozen(missed, status, settings)
        if frozen:  # unfrozen since (jitops.unfreeze()): what was held back
            pending = before_first_build(plan, settings)
        elif remote:  # deferred from before_first_build: only a build needs a sound toolchain
            from .selfcheck import start

            pending = start(plan, settings)
        # the self-check's verdict gates the publish: a refusal publishes (and so loads) nothing
        return build_and_publish(
            plan, pending.gate(cache) if pending is not None else cache, jobs, settings
        )

    try:
        try:
            entry = _locked(plan, cache, build, remote, job, settings)
        except SourcesChanged as e:
            entry = _build_again(plan, e, jobs, settings)
    except Exception:
        # a refusal known by now says more than the build's error
        if pending is not None and pending.done():
            pending.result()
        raise
    if pending is not None:
        # nothing is returned for loading before the verdict (an entry another process built too)
        pending.result()
    return entry


def _locked(
    plan: Plan,
    cache: Cache,
    build: Callable[[Plan], Manifest],
    remote: bool,
    job: bool,
    settings: Settings,
) -> Entry:
    from ..store.lock import key_lock

    with key_lock(cache.lock_path(plan.spec.name, plan.key), plan.what, settings.lock_timeout):
        found = cache.lookup(plan.address, plan.spec.root)
        if isinstance(found, Hit):
            return Entry(plan, found.path, found.manifest, built=False)
        if found.reason is not None and os.path.lexists(plan.entry):
            plan = _next_variant(plan, cache.read_manifest(plan.entry))
            cache.set_aside(plan.entry, found.reason)
        # the remote tier, then the job's store: fetch, or one build per key
        if remote:
            from ..remote import obtain

            variant = plan
            manifest, built = obtain(plan, cache, lambda: build(variant), settings, job)
            return Entry(plan, plan.entry, manifest, built=built)
        return Entry(plan, plan.entry, build(plan), built=True)


def _next_variant(plan: Plan, replaced: Manifest | None) -> Plan:
    """The plan that replaces an entry with the same key (one built from other inputs, or damaged): its
    library registers in a namespace of its own, as this process may hold the one it replaces."""
    if replaced is None:
        return plan
    return dataclasses.replace(plan, variant=replaced.namespace)


def _build_again(
    plan: Plan, changed: SourcesChanged, jobs: int | None, settings: Settings
) -> Entry:
    """A build whose sources changed under it published nothing; build the sources as they are now, with
    their own key (a few times at most: then BuildError). The caller gets the edited library."""
    attempts = _ATTEMPTS.get() + 1
    if attempts >= SOURCE_ATTEMPTS:
        raise BuildError(
            f"the sources of {plan.what} changed during each of {attempts} builds ({changed}); nothing was published. "
            "Fix: let a build finish before saving again, or stop whatever keeps rewriting that file",
            op=plan.spec.name,
            target=plan.target.name,
            log="",
            log_path=None,
        ) from None
    log.info("%s; building it again from the sources as they are now", changed)
    token = _ATTEMPTS.set(attempts)
    try:
        return ensure_entry(plan.redigested(), offline=False, jobs=jobs, settings=settings)
    finally:
        _ATTEMPTS.reset(token)


_ATTEMPTS: contextvars.ContextVar[int] = contextvars.ContextVar("jitops_source_attempts", default=0)
