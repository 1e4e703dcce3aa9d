"""The ``jitops`` command (also ``python -m jitops``).

``main(argv) -> int`` is the only place that turns errors into exit codes and
messages on stderr: 0 success, 1 a failure (a failed build, a failed check, a
damaged entry), 2 bad usage. ``--help``, ``list`` and the cache commands
(except ``cache fingerprint``) answer without importing torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cache import Cache, default_root
from .errors import JitopsError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``500M``, ``1.5G``, ``2GiB``, ``1048576`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected e.g. 500M, 2G, 1.5GiB or a byte count")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``2w``, ``45s`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid age {text!r}: expected e.g. 45s, 30m, 12h, 7d or 2w")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def parse_jobs(text: str) -> int:
    """``--jobs N``: a whole number of parallel compiles, 1 to 4096 (issue 20)."""
    if not (text.strip().isascii() and text.strip().isdigit() and 0 < int(text) <= 4096):
        raise argparse.ArgumentTypeError(f"invalid job count {text!r}: expected a whole number from 1 to 4096")
    return int(text)


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


def _offline() -> bool:
    from .loader import env_flag  # torch-free

    return env_flag("JITOPS_OFFLINE")


def _cache() -> Cache:
    return Cache(default_root())


def _registry() -> Any:
    from .loader import registry

    return registry()


def _specs(names: Sequence[str], everything: bool) -> list[Any]:
    reg = _registry()
    if everything:
        return reg.specs()
    return list(dict.fromkeys(reg.lookup(n) for n in names))


# ------------------------------------------------------------------ commands


def cmd_list(args: argparse.Namespace) -> int:
    reg = _registry()
    cache = _cache()
    for name in reg.names():
        spec = reg.find(name)
        lib_dir = cache.base / "entries" / spec.name
        built = sorted(p.name for p in lib_dir.iterdir() if p.is_dir()) if lib_dir.is_dir() else []
        _out(f"{name:<20} library {spec.name:<14} devices {','.join(spec.devices):<9} "
             f"cached: {', '.join(built) or '-'}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from . import diagnose, loader

    spec = _registry().lookup(args.op)
    plan = loader.make_plan(spec, args.device, args.arch)
    lib_dir = plan.cache.base / "entries" / spec.name
    built = sorted(f"{p.parent.name}/{p.name[:12]}" for p in lib_dir.glob("*/*")) if lib_dir.is_dir() else []
    cached = plan.entry.is_dir() and plan.cache.read_manifest(plan.entry) is not None
    _out(f"op           {args.op} (library {spec.name}; exports {', '.join(spec.exports)})",
         f"description  {spec.description or '-'}",
         *(f"schema       {s}" for s in spec.schemas),
         f"sources      {spec.root}: cpu {', '.join(spec.cpu_sources)}; cuda {', '.join(spec.cuda_sources) or '-'}",
         f"devices      {', '.join(spec.devices)}",
         f"target       {plan.target.name}",
         f"key          {plan.key}",
         f"entry        {plan.entry} ({'cached' if cached else 'not built'})",
         f"built        {', '.join(built) or '-'}",
         f"fingerprint  {diagnose.fingerprint([spec], [plan.target.device], args.arch)}")
    if plan.toolchain_error is not None:
        _out(f"toolchain    missing: {plan.toolchain_error}")
    _out("ingredients  " + json.dumps(plan.ingredients, indent=2, sort_keys=True).replace("\n", "\n             "))
    return 0


class WarmDisplay:
    """One line per finished library; in a terminal also a live line of what is building."""

    def __init__(self, total: int) -> None:
        from .progress import mode

        self.total = total
        self.done = 0
        self.live = mode() == "terminal"
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._tick, daemon=True) if self.live else None

    def _line(self) -> str:
        now = time.monotonic()
        busy = ", ".join(f"{w} {now - t:.0f}s" for w, t in self.running.items())
        return f"jitops warm [{self.done}/{self.total}] {busy}"

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                sys.stderr.write("\r\033[K" + self._line())
                sys.stderr.flush()

    def start(self, task: Any) -> None:
        with self._lock:
            self.running[task.what] = time.monotonic()

    def finish(self, o: Any) -> None:
        with self._lock:
            self.running.pop(o.task.what, None)
            self.done += 1
            if self.live:
                sys.stderr.write("\r\033[K")
            first = o.message.splitlines()[0] if o.message else ""
            detail = f": {first}" if o.status in ("skipped", "failed") else ""
            _out(f"[{self.done}/{self.total}] {o.status:<7} {o.task.spec.name} for {o.target} ({o.seconds:.1f}s){detail}")
            if o.status == "failed" and len(o.message.splitlines()) > 1:
                print("\n".join(o.message.splitlines()[1:]), file=sys.stderr)
            sys.stdout.flush()

    def __enter__(self) -> WarmDisplay:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            sys.stderr.write("\r\033[K")


def cmd_warm(args: argparse.Namespace) -> int:
    from . import diagnose, loader, warm
    from .build import default_jobs

    if not args.ops and not args.all:
        raise SystemExit("jitops warm: name the ops to build, or pass --all")
    if _offline():
        raise JitopsError("jitops warm builds entries, and JITOPS_OFFLINE=1 forbids building. "
                          "Fix: unset JITOPS_OFFLINE in the job that warms the cache")
    start = time.monotonic()
    specs = _specs(args.ops, args.all)
    devices = args.device or diagnose.default_devices(loader.probe(), args.arch)
    tasks = warm.tasks_for(specs, devices)
    jobs = args.jobs or default_jobs()
    saved = os.environ.get("JITOPS_PROGRESS")
    display = WarmDisplay(len(tasks))
    os.environ["JITOPS_PROGRESS"] = "0"  # the warm display replaces the per-build progress line
    try:
        with display:
            outcomes = warm.warm(tasks, archs=args.arch, jobs=jobs, on_start=display.start, on_done=display.finish)
    finally:
        if saved is None:
            os.environ.pop("JITOPS_PROGRESS", None)
        else:
            os.environ["JITOPS_PROGRESS"] = saved
    count = {s: sum(o.status == s for o in outcomes) for s in ("built", "cached", "skipped", "failed")}
    _out(f"warm: {count['built']} built, {count['cached']} cached, {count['skipped']} skipped, "
         f"{count['failed']} failed in {time.monotonic() - start:.1f}s (jobs {jobs}; cache {_cache().root})")
    if count["skipped"] and args.strict:
        print("jitops warm: --strict: some entries were skipped (see above)", file=sys.stderr)
    return 1 if count["failed"] or (count["skipped"] and args.strict) else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import diagnose

    checks = diagnose.doctor(_registry().specs())
    for c in checks:
        _out(f"{c.status.upper():<5} {c.name:<12} {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            _out(f"{'':<5} {'':<12} fix: {c.fix}")
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        print(f"jitops doctor: a build would fail here ({', '.join(failed)}); see the fixes above", file=sys.stderr)
    return 1 if failed else 0


def _show(value: Any) -> str:
    return value if value == "(absent)" else json.dumps(value)


def cmd_explain(args: argparse.Namespace) -> int:
    from . import diagnose

    spec = _registry().lookup(args.op)
    ex = diagnose.explain(spec, args.device, args.arch)
    _out(f"{args.op} (library {spec.name}) on this machine: {ex.plan.target.name}, key {ex.plan.key[:12]}",
         ex.verdict)
    if ex.nearest is not None and ex.diffs:
        _out(f"nearest cached entry: {ex.nearest}", "differing ingredients (cached -> here):")
        for path, cached, here in ex.diffs:
            if isinstance(cached, list) and isinstance(here, list):
                added = [x for x in here if x not in cached]
                removed = [x for x in cached if x not in here]
                _out(f"  {path}: " + " ".join([*(f"+{x}" for x in added), *(f"-{x}" for x in removed)] or ["(order)"]))
            else:
                _out(f"  {path}: {_show(cached)} -> {_show(here)}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from . import cache_admin as admin

    cache = _cache()
    sub = args.cache_cmd
    if (sub in ("prune", "clear", "import", "repair") or getattr(args, "remove", False)) and _offline():
        raise JitopsError(f"`jitops cache {sub}` writes to the cache, and JITOPS_OFFLINE=1 forbids writing. "
                          "Fix: run cache maintenance without JITOPS_OFFLINE")
    if sub == "path":
        _out(str(cache.root))
    elif sub == "fingerprint":
        from . import diagnose, loader

        devices = args.device or diagnose.default_devices(loader.probe(), args.arch)
        _out(diagnose.fingerprint(_registry().specs(), devices, args.arch))
    elif sub == "ls":
        now = time.time()
        infos = admin.entries(cache)
        _out(f"{'op':<14} {'target':<18} {'key':<12} {'size':>10} {'age':>9} {'last use':>9}")
        for e in sorted(infos, key=lambda e: (e.library, e.target, -e.last_use)):
            age = human_age(now - e.manifest.built_at) if e.manifest else "damaged"
            _out(f"{e.library:<14} {e.target:<18} {e.key[:12]:<12} {human_size(e.size):>10} {age:>9} "
                 f"{human_age(now - e.last_use):>9}")
        _out(f"{len(infos)} entries, {human_size(sum(e.size for e in infos))} in {cache.root}")
    elif sub == "verify":
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
            print(f"jitops cache verify: {bad} damaged entr{'y' if bad == 1 else 'ies'}"
                  + (" removed" if args.remove else "; they are rebuilt on next use, or remove them with "
                     "`jitops cache verify --remove`"), file=sys.stderr)
        return 1 if bad and not args.remove else 0
    elif sub in ("prune", "clear"):
        if sub == "prune" and args.max_size is None and args.older_than is None:
            raise SystemExit("jitops cache prune: give --max-size and/or --older-than")
        result = admin.clear(cache) if sub == "clear" else admin.prune(
            cache, max_size=args.max_size, older_than=args.older_than)
        for e in result.removed:
            _out(f"removed {e.library}/{e.target}/{e.key[:12]} ({human_size(e.size)})")
        for e in result.busy:
            _out(f"kept    {e.library}/{e.target}/{e.key[:12]}: being built by another process")
        _out(f"{sub}: removed {len(result.removed)} entries ({human_size(sum(e.size for e in result.removed))}); "
             f"{human_size(result.kept_bytes)} kept")
        if sub == "prune" and args.max_size is not None and result.kept_bytes > args.max_size:
            print(f"jitops cache prune: still above {human_size(args.max_size)}: entries being built were kept",
                  file=sys.stderr)
    elif sub == "repair":  # issue 20: clear obstructed cache paths
        return cmd_cache_repair(cache)
    elif sub == "export":
        libs = {_registry().lookup(op).name for op in args.ops} if args.ops else None
        exported, skipped = admin.export(cache, Path(args.file), libs)
        for e, why in skipped:
            print(f"skipped {e.library}/{e.target}/{e.key[:12]}: {why}", file=sys.stderr)
        _out(f"exported {len(exported)} entries to {args.file}")
    elif sub == "import":
        res = admin.import_archive(cache, Path(args.file))
        for m in res.imported:
            _out(f"imported {m.library}/{m.target}/{m.key[:12]}")
        for m, why in res.foreign:
            _out(f"note     {m.library}/{m.target}/{m.key[:12]} is {why}: kept, but never loaded here")
        for where, why in res.rejected:
            print(f"rejected {where}: {why}", file=sys.stderr)
        _out(f"import: {len(res.imported)} imported, {len(res.present)} already present, "
             f"{len(res.rejected)} rejected, {res.records} toolchain records")
        return 1 if res.rejected else 0
    return 0


def cmd_cache_repair(cache: Cache) -> int:
    from . import obstruct

    done = obstruct.repair(cache)
    for ob, action in done:
        _out(f"{ob}: {action}")
    left = [ob for ob, action in done if action.startswith("could not")]
    _out(f"repair: {len(done) - len(left)} obstruction(s) cleared in {cache.root}")
    if left:
        print(f"jitops cache repair: {len(left)} path(s) could not be cleared (see above)", file=sys.stderr)
    return 1 if left else 0


# ------------------------------------------------------------------ parser


def _target_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument("--device", action="append", choices=("cpu", "cuda"),
                       help="device to build for (repeatable; default: cpu, plus cuda with a GPU or --arch)")
    else:
        p.add_argument("--device", choices=("cpu", "cuda"), help="device (default: this machine's current device)")
    p.add_argument("--arch", metavar="LIST", help="CUDA archs, e.g. 8.0,9.0 (default: TORCH_CUDA_ARCH_LIST, else the GPU)")


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    parser = argparse.ArgumentParser(prog="jitops", description="Build, inspect and manage jitops's kernel cache.")
    parser.add_argument("--version", action="version", version=f"jitops {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("list", help="ops and the targets already cached").set_defaults(fn=cmd_list)
    p = sub.add_parser("info", help="an op's schemas, sources, key, ingredients and cache path")
    p.add_argument("op")
    _target_args(p)
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser("warm", help="build cache entries ahead of time (in parallel)")
    p.add_argument("ops", nargs="*", metavar="OP")
    p.add_argument("--all", action="store_true", help="every known op")
    _target_args(p, many=True)
    p.add_argument("--jobs", type=parse_jobs, metavar="N", help="parallel compiles (default: from cores and free memory)")
    p.add_argument("--strict", action="store_true", help="exit non-zero if any CUDA entry had to be skipped")
    p.set_defaults(fn=cmd_warm)
    sub.add_parser("doctor", help="check that builds work here; exit 1 with the fix if not").set_defaults(fn=cmd_doctor)
    p = sub.add_parser("explain", help="why this machine would build or rebuild an op")
    p.add_argument("op")
    _target_args(p)
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("cache", help="inspect and manage the cache directory")
    p.set_defaults(fn=cmd_cache)
    cs = p.add_subparsers(dest="cache_cmd", required=True, metavar="ACTION")
    cs.add_parser("path", help="print the cache root")
    _target_args(cs.add_parser("fingerprint", help="hash of every key ingredient, for keying a CI cache"), many=True)
    cs.add_parser("ls", help="entries: op, target, key, size, age, last use")
    cs.add_parser("verify", help="re-check every entry's sha256").add_argument(
        "--remove", action="store_true", help="remove damaged entries")
    q = cs.add_parser("prune", help="evict least-recently-used entries")
    q.add_argument("--max-size", type=parse_size, metavar="SIZE", help="keep at most this much, e.g. 2G")
    q.add_argument("--older-than", type=parse_age, metavar="AGE", help="evict entries unused for this long, e.g. 30d")
    cs.add_parser("clear", help="remove everything jitops put in the cache (not entries being built)")
    cs.add_parser("repair", help="clear folders, files or links that stand where the cache keeps something else")
    q = cs.add_parser("export", help="write entries to a portable archive (tar.gz)")
    q.add_argument("file")
    q.add_argument("ops", nargs="*", metavar="OP", help="only these ops' libraries (default: all)")
    cs.add_parser("import", help="add the entries of an exported archive").add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.fn(args))
    except SystemExit as e:  # argparse and usage errors
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("jitops: interrupted", file=sys.stderr)
        return 130
    except (JitopsError, OSError, ValueError) as e:
        print(f"jitops: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    """A plain OSError as its cause and path, without the errno (issue 20); jitops's own errors as written."""
    if isinstance(e, OSError) and not isinstance(e, JitopsError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e)
