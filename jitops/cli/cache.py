"""``jitops cache ...``: one function per action, and its part of the parser.

Answers without importing torch, except ``fingerprint``.

Imports: store.cache, errors, settings; lazily: admin, archive, diagnose and target (fingerprint only), repair,
registry, remote.commands (its sub-commands keygen, push, pull, stats and ``ls --remote``), remote.archive_trust
(export signs, import verifies and notes origins).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..store.cache import Cache
from ..errors import JitopsError
from ..base.settings import Settings

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``500M``, ``1.5G``, ``2GiB``, ``1048576`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: expected e.g. 500M, 2G, 1.5GiB or a byte count"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``2w``, ``45s`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid age {text!r}: expected e.g. 45s, 30m, 12h, 7d or 2w"
        )
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    for limit, unit, div in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{max(0, seconds) / div:.0f}{unit} ago"
    return f"{seconds / 86400:.0f}d ago"


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
    from ..target import probe

    devices = args.device or diagnose.default_devices(probe(), args.arch)
    _out(diagnose.fingerprint(_registry().specs(), devices, args.arch))
    return 0


def _ls(cache: Cache, args: argparse.Namespace) -> int:
    from ..store import admin

    if args.remote:  # the remote tier
        from ..remote.commands import cmd_ls_remote

        return cmd_ls_remote(Settings.from_env())

    now = time.time()
    infos = admin.entries(cache)
    _out(f"{'op':<14} {'target':<18} {'key':<12} {'size':>10} {'age':>9} {'last use':>9}")
    for e in sorted(infos, key=lambda e: (e.library, e.target, -e.last_use)):
        age = human_age(now - e.manifest.built_at) if e.manifest else "damaged"
        _out(
            f"{e.library:<14} {e.target:<18} {e.key[:12]:<12} {human_size(e.size):>10} {age:>9} "
            f"{human_age(now - e.last_use):>9}"
        )
    _out(f"{len(infos)} entries, {human_size(sum(e.size for e in infos))} in {cache.root}")
    parts = admin.cache_parts.all_parts(cache, now)
    use = admin.cache_parts.usage(parts)
    (n_obj, b_obj), (n_pch, b_pch) = use["object"], use["pch"]
    _out(
        f"{n_obj} per-file objects, {human_size(b_obj)}; {n_pch} precompiled headers, {human_size(b_pch)} "
        f"(rebuildable; `jitops cache prune` bounds them with the entries)",
        "",
        f"{'kind':<11} {'items':>6} {'size':>10}",
    )
    for kind, n, size in admin.kind_sizes(cache, infos, parts):
        _out(f"{kind:<11} {n:>6} {human_size(size):>10}")
    cap = Settings.from_env().pch_max_size
    _out(
        f"PCHs and objects are kept under {human_size(cap)} (JITOPS_PCH_MAX_SIZE), least recently used first"
        if cap
        else "PCHs and objects are not bounded (JITOPS_PCH_MAX_SIZE=0)"
    )
    return 0


def _verify(cache: Cache, args: argparse.Namespace) -> int:
    from ..store import admin

    bad = 0
    for e in admin.entries(cache):
        problem = admin.check(cache, e)
        if problem is None:
            _out(f"ok      {e.library}/{e.target}/{e.key[:12]}")
            continue
        bad += 1
        _out(f"BAD     {e.library}/{e.target}/{e.key[:12]}: {problem}")
        if args.remove:
            with admin.unless_building(cache, e.library, e.key) as free:
                if free:
                    admin.remove_entry(cache, e.path)
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
    from ..store import admin

    sub = args.cache_cmd
    if sub == "prune" and args.max_size is None and args.older_than is None:
        raise SystemExit("jitops cache prune: give --max-size and/or --older-than")
    result = (
        admin.clear(cache)
        if sub == "clear"
        else admin.prune(cache, max_size=args.max_size, older_than=args.older_than)
    )
    for e in result.removed:
        _out(f"removed {e.library}/{e.target}/{e.key[:12]} ({human_size(e.size)})")
    for e in result.busy:
        _out(f"kept    {e.library}/{e.target}/{e.key[:12]}: being built by another process")
    for p in result.parts_removed:
        _out(f"removed {p.label} ({human_size(p.size)})")
    for p in result.parts_busy:
        _out(
            f"kept    {p.label}: being built or used by a build (in the last {admin.cache_parts.GRACE / 60:.0f} min)"
        )
    parts = f"{len(result.parts_removed)} objects and PCHs ({human_size(sum(p.size for p in result.parts_removed))}); "
    _out(
        f"{sub}: removed {len(result.removed)} entries ({human_size(sum(e.size for e in result.removed))}), "
        f"{parts if sub == 'prune' else ''}{human_size(result.kept_bytes)} kept"
    )
    if sub == "prune" and args.max_size is not None and result.kept_bytes > args.max_size:
        print(
            f"jitops cache prune: still above {human_size(args.max_size)}: what is being built or used was kept",
            file=sys.stderr,
        )
    return 0


def _export(cache: Cache, args: argparse.Namespace) -> int:
    from ..store import archive
    from ..remote.archive_trust import archive_signer

    libs = {_registry().lookup(op).name for op in args.ops} if args.ops else None
    sign, signed = archive_signer(Settings.from_env(), cache), []
    if sign is not None:

        def sign_built(info: Any, raw: bytes) -> Any:  # counts what was signed: entries built here
            done = sign(info, raw)
            signed.extend([info] if done else [])
            return done

    exported, skipped = archive.export(
        cache, Path(args.file), libs, sign=sign_built if sign is not None else None
    )
    for e, why in skipped:
        print(f"skipped {e.library}/{e.target}/{e.key[:12]}: {why}", file=sys.stderr)
    how = (
        "unsigned (no signing key here: `jitops cache keygen` makes one)"
        if sign is None
        else f"{len(signed)} signed with your key, {len(exported) - len(signed)} unsigned (not built here)"
    )
    _out(f"exported {len(exported)} entries to {args.file}: {how}")
    return 0


def _import(cache: Cache, args: argparse.Namespace) -> int:
    from ..store import archive
    from ..remote.archive_trust import archive_trust, origin_noter

    res = archive.import_archive(
        cache,
        Path(args.file),
        verify=archive_trust(Settings.from_env()),
        note=origin_noter(cache, str(Path(args.file).resolve())),
    )
    for m in res.imported:
        _out(f"imported {m.library}/{m.target}/{m.key[:12]}")
    for m, why in res.foreign:
        _out(f"note     {m.library}/{m.target}/{m.key[:12]} is {why}: kept, but never loaded here")
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
    cs.add_parser("verify", help="re-check every entry's sha256").add_argument(
        "--remove", action="store_true", help="remove damaged entries"
    )
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
    )
    cs.add_parser(
        "repair",
        help="clear folders, files or links that stand where the cache keeps something else",
    )
    q = cs.add_parser("export", help="write entries to a portable archive (tar.gz)")
    q.add_argument("file", help="the archive to write (.tar.gz)")
    q.add_argument("ops", nargs="*", metavar="OP", help="only these ops' libraries (default: all)")
    cs.add_parser("import", help="add the entries of an exported archive").add_argument(
        "file", help="an archive written by `jitops cache export`"
    )
    # the remote tier: keygen, push, pull, stats
    from ..remote.commands import (
        add_cache_parsers,
    )

    add_cache_parsers(cs)
