"""``jitops cache ...``: one function per action, and its part of the parser.

Each action calls :mod:`jitops.cache` (the Python API) and prints what it returns, so the command
and the API never disagree; only ``path``, ``fingerprint``, ``repair``, ``stats`` and ``keygen``
have no counterpart there. Answers without importing torch, except ``fingerprint``, ``push`` and
``pull``.

Imports: cache (the API), base.settings, base.units, errors, store.cache; lazily: diagnose and
target (fingerprint only), registry, remote.commands (its sub-commands keygen, push, pull, stats and
``ls --remote``), store.parts (``GRACE``), store.repair.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from .. import cache as api
from ..base.settings import Settings
from ..base.units import human_age, human_size, parse_age as _parse_age, parse_size as _parse_size
from ..errors import JitopsError
from ..store.cache import Cache

__all__ = ["add_parser", "cmd_cache", "human_age", "human_size", "parse_age", "parse_size"]


def parse_size(text: str) -> int:
    """``--max-size``: ``500M``, ``1.5G``, ``2GiB``, ``1048576`` -> bytes (binary units;
    base.units)."""
    try:
        return _parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_age(text: str) -> float:
    """``--older-than``: ``30m``, ``12h``, ``7d``, ``2w``, ``45s`` -> seconds (base.units)."""
    try:
        return _parse_age(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _out(*lines: str) -> None:
    for line in lines:
        print(line)


def _registry() -> Any:
    from ..registry import registry  # torch-free

    return registry()


def _path(cache: Cache, args: argparse.Namespace) -> int:
    _out(str(cache.root))
    return 0


def _fingerprint(cache: Cache, args: argparse.Namespace) -> int:
    from . import diagnose
    from ..api.warm import default_devices
    from ..target import probe

    devices = args.device or default_devices(probe(), args.arch)
    _out(diagnose.fingerprint(_registry().specs(), devices, args.arch))
    return 0


def _ls(cache: Cache, args: argparse.Namespace) -> int:
    if args.remote:  # the remote tier
        from ..remote.commands import cmd_ls_remote

        return cmd_ls_remote(Settings.from_env())

    now = time.time()
    found = api.entries()
    _out(f"{'op':<14} {'target':<18} {'key':<12} {'size':>10} {'age':>9} {'last use':>9}")
    for e in sorted(found, key=lambda e: (e.op, e.target, -e.last_use)):
        age = human_age(now - e.built_at) if e.built_at is not None else "damaged"
        _out(
            f"{e.op:<14} {e.target:<18} {e.key[:12]:<12} {human_size(e.size):>10} {age:>9} "
            f"{human_age(now - e.last_use):>9}"
        )
    summary = api.info()
    _out(f"{len(found)} entries, {human_size(sum(e.size for e in found))} in {summary.location}")
    (n_obj, b_obj), (n_pch, b_pch) = summary.objects, summary.pchs
    _out(
        f"{n_obj} per-file objects, {human_size(b_obj)}; {n_pch} precompiled headers, {human_size(b_pch)} "
        f"(rebuildable; `jitops cache prune` bounds them with the entries)",
        "",
        f"{'kind':<11} {'items':>6} {'size':>10}",
    )
    for kind, n, size in summary.kinds:
        _out(f"{kind:<11} {n:>6} {human_size(size):>10}")
    _out(_budget(summary.parts_budget))
    return 0


def _budget(cap: int) -> str:
    return (
        f"PCHs and objects are kept under {human_size(cap)} (JITOPS_PCH_MAX_SIZE), least recently used first"
        if cap
        else "PCHs and objects are not bounded (JITOPS_PCH_MAX_SIZE=0)"
    )


def _info(cache: Cache, args: argparse.Namespace) -> int:
    s = api.info()
    _out(
        f"location  {s.location}",
        f"entries   {s.entries}",
        f"size      {human_size(s.size)} (entries, objects and PCHs: what `jitops cache prune` "
        "bounds)",
        f"total     {human_size(s.total)} (with staging, logs, trash, inline sources, toolchain "
        "records, locks)",
        f"budget    {_budget(s.parts_budget)}; entries: none (`jitops cache prune --max-size "
        "SIZE`)",
    )
    return 0


def _verify(cache: Cache, args: argparse.Namespace) -> int:
    verdicts = api.verify(args.op, remove=args.remove)
    for v in verdicts:
        what = f"{v.entry.op}/{v.entry.target}/{v.entry.key[:12]}"
        _out(f"ok      {what}" if v.ok else f"BAD     {what}: {v.problem}")
    bad = sum(not v.ok for v in verdicts)
    if bad:
        print(
            f"jitops cache verify: {bad} damaged entr{'y' if bad == 1 else 'ies'}"
            + (
                " removed"
                if args.remove
                else "; they are rebuilt on next use, or remove them with "
                "`jitops cache verify --remove`"
            ),
            file=sys.stderr,
        )
    return 1 if bad and not args.remove else 0


def _prune_or_clear(cache: Cache, args: argparse.Namespace) -> int:
    from ..store import parts

    sub = args.cache_cmd
    if sub == "prune" and args.max_size is None and args.older_than is None:
        raise SystemExit("jitops cache prune: give --max-size and/or --older-than")
    if sub == "clear":
        results = [api.clear(op) for op in args.ops] if args.ops else [api.clear()]
    else:
        results = [api.prune(max_size=args.max_size, older_than=args.older_than)]
    for result in results:
        for e in result.removed:
            _out(f"removed {e.op}/{e.target}/{e.key[:12]} ({human_size(e.size)})")
        for e in result.busy:
            _out(f"kept    {e.op}/{e.target}/{e.key[:12]}: being built by another process")
        for p in result.parts_removed:
            _out(f"removed {p.label} ({human_size(p.size)})")
        for p in result.parts_busy:
            _out(
                f"kept    {p.label}: being built or used by a build (in the last "
                f"{parts.GRACE / 60:.0f} min)"
            )
    removed = [e for r in results for e in r.removed]
    gone = [p for r in results for p in r.parts_removed]
    kept = sum(r.kept for r in results)
    what = f"{len(gone)} objects and PCHs ({human_size(sum(p.size for p in gone))}); "
    _out(
        f"{sub}: removed {len(removed)} entries ({human_size(sum(e.size for e in removed))}), "
        f"{what if sub == 'prune' else ''}{human_size(kept)} kept"
    )
    if sub == "prune" and args.max_size is not None and kept > args.max_size:
        print(
            f"jitops cache prune: still above {human_size(args.max_size)}: what is being built or used was kept",
            file=sys.stderr,
        )
    return 0


def _export(cache: Cache, args: argparse.Namespace) -> int:
    res = api.export(args.file, args.ops)
    for e, why in res.skipped:
        print(f"skipped {e.op}/{e.target}/{e.key[:12]}: {why}", file=sys.stderr)
    how = (
        "unsigned (no signing key here: `jitops cache keygen` makes one)"
        if not res.signing_key
        else f"{len(res.signed)} signed with your key, {len(res.entries) - len(res.signed)} "
        "unsigned (not built here)"
    )
    _out(f"exported {len(res.entries)} entries to {args.file}: {how}")
    return 0


def _import(cache: Cache, args: argparse.Namespace) -> int:
    res = api.import_(args.file)
    for m in res.imported:
        _out(f"imported {m.op}/{m.target}/{m.key[:12]}")
    for m, why in res.foreign:
        _out(f"note     {m.op}/{m.target}/{m.key[:12]} is {why}: kept, but never loaded here")
    for where, why in res.rejected:
        print(f"rejected {where}: {why}", file=sys.stderr)
    if res.unsigned:
        _out(
            f"unsigned {len(res.unsigned)} entr{'y' if len(res.unsigned) == 1 else 'ies'} of {args.file} came unsigned: "
            "that is code you chose to trust (noted as imported; `jitops cache push` will not sign it)"
        )
    _out(
        f"import: {len(res.imported)} imported, {len(res.present)} already present, "
        f"{len(res.rejected)} rejected, {res.records} toolchain records"
    )
    return 1 if res.rejected else 0


def _repair(cache: Cache, args: argparse.Namespace) -> int:
    """Clear folders, files or links standing where the cache keeps something else."""
    from ..store import repair

    done = repair.repair(cache)
    for ob, action in done:
        _out(f"{ob}: {action}")
    left = [ob for ob, action in done if action.startswith("could not")]
    _out(f"repair: {len(done) - len(left)} obstruction(s) cleared in {cache.root}")
    if left:
        print(
            f"jitops cache repair: {len(left)} path(s) could not be cleared (see above)",
            file=sys.stderr,
        )
    return 1 if left else 0


ACTIONS: dict[str, Callable[[Cache, argparse.Namespace], int]] = {
    "path": _path,
    "info": _info,
    "fingerprint": _fingerprint,
    "ls": _ls,
    "verify": _verify,
    "prune": _prune_or_clear,
    "clear": _prune_or_clear,
    "export": _export,
    "import": _import,
    "repair": _repair,
}
WRITES = ("prune", "clear", "import", "repair")  # and verify --remove


def cmd_cache(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    sub = args.cache_cmd
    if (sub in WRITES or getattr(args, "remove", False)) and settings.offline:
        raise JitopsError(
            f"`jitops cache {sub}` writes to the cache, and JITOPS_OFFLINE=1 forbids writing. "
            "Fix: run cache maintenance without JITOPS_OFFLINE"
        )
    return ACTIONS[sub](Cache(settings.cache_root()), args)


def add_parser(sub: Any, target_args: Callable[..., None]) -> None:
    """The ``cache`` command and its actions, under the main parser's subcommands ``sub``."""
    p = sub.add_parser("cache", help="inspect and manage the cache directory")
    p.set_defaults(fn=cmd_cache)
    cs = p.add_subparsers(dest="cache_cmd", required=True, metavar="ACTION")
    cs.add_parser("path", help="print the cache root")
    cs.add_parser(
        "info", help="a summary: location, entries, sizes, budget (`jitops cache ls` lists them)"
    )
    target_args(
        cs.add_parser("fingerprint", help="hash of every key ingredient, for keying a CI cache"),
        many=True,
    )
    cs.add_parser(
        "ls", help="entries: op, target, key, size, age, last use; bytes of objects and PCHs"
    ).add_argument(
        "--remote",
        action="store_true",
        help="list the remote cache's entries (JITOPS_REMOTE_CACHE)",
    )
    q = cs.add_parser("verify", help="re-check every entry's sha256")
    q.add_argument("--remove", action="store_true", help="remove damaged entries")
    q.add_argument("op", nargs="?", metavar="OP", help="only this op's library (default: all)")
    q = cs.add_parser(
        "prune", help="evict least-recently-used entries, per-file objects and precompiled headers"
    )
    q.add_argument(
        "--max-size", type=parse_size, metavar="SIZE", help="keep at most this much in all, e.g. 2G"
    )
    q.add_argument(
        "--older-than",
        type=parse_age,
        metavar="AGE",
        help="evict what was unused for this long, e.g. 30d",
    )
    cs.add_parser(
        "clear", help="remove everything jitops put in the cache (not entries being built)"
    ).add_argument(
        "ops", nargs="*", metavar="OP", help="only these ops' libraries' entries (default: all)"
    )
    cs.add_parser(
        "repair",
        help="clear folders, files or links that stand where the cache keeps something else",
    )
    q = cs.add_parser("export", help="write entries to a portable archive (tar.gz)")
    q.add_argument("file")
    q.add_argument("ops", nargs="*", metavar="OP", help="only these ops' libraries (default: all)")
    cs.add_parser("import", help="add the entries of an exported archive").add_argument("file")
    # the remote tier: keygen, push, pull, stats
    from ..remote.commands import (
        add_cache_parsers,
    )

    add_cache_parsers(cs)
