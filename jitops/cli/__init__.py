"""Subpackage ``jitops.cli`` (stage 17; only ``jitops.__main__`` is above it): the command line.
Owns: this module (``main``, ``build_parser``; ``list``, ``info``, ``warm``, ``doctor``,
``explain``, ``bench``), ``cache`` (``jitops cache ...``), ``diagnose`` (``doctor``,
``fingerprint``) and ``explain``. Public name: ``main(argv) -> int``. May import: every stage below
it (bench, jitops, distributed, cache, loader, api, loading, build, remote, plan, store, key,
target, registry, kernels, spec, base, errors, _version).

This module: the ``jitops`` command (also ``python -m jitops``). ``main(argv) -> int`` is the only place that turns errors into exit codes and
messages on stderr: 0 success, 1 a failure (a failed build, a failed check, a
damaged entry), 2 bad usage, 141 (quietly) when the reader of stdout went away
(``| head``). ``--help``, ``list`` and the cache commands (except ``cache fingerprint``,
``push`` and ``pull``) answer without importing torch.

Imports: store.cache, cli.cache, errors, settings; lazily per command: _version, admin, bench_ops,
diagnose, entry, explain, manifest, plan, progress, runner, target, tubuild, warm; remote.commands
for ``warm --push``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import bundle as cli_bundle, cache as cli_cache
from ..store.cache import Cache
from ..errors import JitopsError
from ..base.settings import Settings

if TYPE_CHECKING:
    from ..store.manifest import Manifest


def _out(*lines: str) -> None:
    for line in lines:
        print(line)


def _cache() -> Cache:
    return Cache(Settings.from_env().cache_root())


_registry = cli_cache._registry


def parse_jobs(text: str) -> int:
    """``--jobs N``: a whole number of parallel compiles, 1 to 4096."""
    if not (text.strip().isascii() and text.strip().isdigit() and 0 < int(text) <= 4096):
        raise argparse.ArgumentTypeError(
            f"invalid job count {text!r}: expected a whole number from 1 to 4096"
        )
    return int(text)


def _specs(names: Sequence[str], everything: bool) -> list[Any]:
    reg = _registry()
    if everything:
        return reg.specs()
    return list(dict.fromkeys(reg.lookup(n) for n in names))


# ------------------------------------------------------------------ commands


def cmd_list(args: argparse.Namespace) -> int:
    """Each registered op with the targets its library has entries for, then every other library
    the cache holds entries of (``jitops.load`` and ``load_inline`` libraries are registered only
    in the process that loaded them), as ``jitops cache ls`` lists them."""
    from ..store import admin

    reg = _registry()
    cached: dict[str, set[str]] = {}
    for entry in admin.entries(_cache()):
        cached.setdefault(entry.library, set()).add(entry.target)
    for name in reg.names():
        spec = reg.find(name)
        _out(
            f"{name:<20} library {spec.name:<14} devices {','.join(spec.devices):<9} "
            f"cached: {', '.join(sorted(cached.get(spec.name, ()))) or '-'}"
        )
    others = sorted(set(cached) - {spec.name for spec in reg.specs()})
    if others:
        _out("", "other libraries in the cache (jitops.load, load_inline, kernel packages):")
    for library in others:
        _out(f"{'':<20} library {library:<14} cached: {', '.join(sorted(cached[library]))}")
    return 0


def _build_time(manifest: Manifest) -> str:
    """How long the cached entry took to build, and where the time went (per file, PCH, link)."""
    from ..build.tubuild import summary

    where = summary(manifest.timings)
    return f"{manifest.build_seconds:.1f}s" + (f" ({where})" if where else "")


def cmd_info(args: argparse.Namespace) -> int:
    from . import diagnose
    from ..build.entry import Damaged, Miss, entry_status
    from ..store.manifest import Hit
    from ..plan import make_plan

    settings = Settings.from_env()
    spec = _registry().lookup(args.op)
    plan = make_plan(spec, args.device, args.arch, settings=settings)
    lib_dir = plan.cache.library_dir(spec.name)
    built = (
        sorted(f"{p.parent.name}/{p.name[:12]}" for p in lib_dir.glob("*/*"))
        if lib_dir.is_dir()
        else []
    )
    status = entry_status(plan)
    state = (
        "not built"
        if isinstance(status, Miss)
        else f"damaged, rebuilt on next use: {status.reason}"
        if isinstance(status, Damaged)
        else "cached"
    )
    _out(
        f"op           {args.op} (library {spec.name}; exports {', '.join(spec.exports)})",
        f"description  {spec.description or '-'}",
        *(f"schema       {s}" for s in spec.schemas),
        f"sources      {spec.root}: cpu {', '.join(spec.cpu_sources)}; cuda {', '.join(spec.cuda_sources) or '-'}",
        f"devices      {', '.join(spec.devices)}",
        f"target       {plan.target.name}",
        f"key          {plan.key}",
        f"entry        {plan.entry} ({state})",
        *([f"build time   {_build_time(status.manifest)}"] if isinstance(status, Hit) else []),
        f"built        {', '.join(built) or '-'}",
        f"fingerprint  {diagnose.fingerprint([spec], [plan.target.device], args.arch, settings)} (this library on "
        f"{plan.target.device}, compiler left out; the machine's, every op: `jitops cache fingerprint`)",
    )
    if plan.toolchain_error is not None:
        _out(f"toolchain    missing: {plan.toolchain_error}")
    _out(
        "ingredients  "
        + json.dumps(plan.ingredients, indent=2, sort_keys=True).replace("\n", "\n             ")
    )
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    import dataclasses

    from ..api import warm
    from ..build.runner import default_jobs
    from ..base.progress import WarmDisplay
    from ..target import probe

    if not args.ops and not args.all:
        raise SystemExit("jitops warm: name the ops to build, or pass --all")
    settings = Settings.from_env()
    if settings.offline:
        raise JitopsError(
            "jitops warm builds entries, and JITOPS_OFFLINE=1 forbids building. "
            "Fix: unset JITOPS_OFFLINE in the job that warms the cache"
        )
    start = time.monotonic()
    specs = _specs(args.ops, args.all)
    devices = args.device or warm.default_devices(probe(), args.arch)
    tasks = warm.tasks_for(specs, devices)
    jobs = args.jobs or default_jobs(settings.jobs)
    display = WarmDisplay(len(tasks), forced=settings.progress)
    # the warm display replaces the per-build progress line
    quiet = dataclasses.replace(settings, progress=False)
    with display:
        outcomes = warm.warm(
            tasks,
            archs=args.arch,
            jobs=jobs,
            on_start=display.start,
            on_done=display.finish,
            settings=quiet,
        )
    count = {
        s: sum(o.status == s for o in outcomes) for s in ("built", "cached", "skipped", "failed")
    }
    _out(
        f"warm: {count['built']} built, {count['cached']} cached, {count['skipped']} skipped, "
        f"{count['failed']} failed in {time.monotonic() - start:.1f}s (jobs {jobs}; cache {settings.cache_root()})"
    )
    if count["skipped"] and args.strict:
        print("jitops warm: --strict: some entries were skipped (see above)", file=sys.stderr)
    # the remote tier: sign and upload what was warmed
    if args.push and not count["failed"]:
        from ..remote.commands import push_warmed

        push_warmed([s.exports[0] for s in specs], args.device)
    return 1 if count["failed"] or (count["skipped"] and args.strict) else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import diagnose

    if args.offline_ready:
        return _offline_ready(args.offline_ready, args.device)
    if args.device:
        raise SystemExit("jitops doctor: --device goes with --offline-ready OP...")
    checks = diagnose.doctor(_registry().specs(), recheck=args.recheck)
    for c in checks:
        _out(f"{c.status.upper():<5} {c.name:<12} {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            _out(f"{'':<5} {'':<12} fix: {c.fix}")
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        print(
            f"jitops doctor: a build would fail here ({', '.join(failed)}); see the fixes above",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _offline_ready(ops: Sequence[str], device: str | None) -> int:
    """``doctor --offline-ready``: one line per op, exit 1 unless every op would load with zero builds here."""
    from .explain import offline_ready

    rows = offline_ready(ops, device)
    for name, ready, why in rows:
        _out(f"{'READY' if ready else 'NOT READY':<9} {name:<16} {why}")
    unready = [name for name, ready, _ in rows if not ready]
    if unready:
        print(
            f"jitops doctor: {len(unready)} of {len(rows)} ops would build (or fail) on first use here: "
            f"{', '.join(unready)}",
            file=sys.stderr,
        )
    return 1 if unready else 0


def _show(value: Any) -> str:
    return value if value == "(absent)" else json.dumps(value)


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import explain

    spec = _registry().lookup(args.op)
    ex = explain(spec, args.device, args.arch)
    _out(
        f"{args.op} (library {spec.name}) on this machine: {ex.plan.target.name}, key {ex.plan.key[:12]}",
        ex.verdict,
    )
    if ex.nearest is not None and ex.diffs:
        _out(f"nearest cached entry: {ex.nearest}", "differing ingredients (cached -> here):")
        for path, cached, here in ex.diffs:
            if isinstance(cached, list) and isinstance(here, list):
                added = [x for x in here if x not in cached]
                removed = [x for x in cached if x not in here]
                _out(
                    f"  {path}: "
                    + " ".join(
                        [*(f"+{x}" for x in added), *(f"-{x}" for x in removed)] or ["(order)"]
                    )
                )
            else:
                _out(f"  {path}: {_show(cached)} -> {_show(here)}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import bench_ops  # imports torch

    if args.rounds < 1:
        raise SystemExit(f"jitops bench: --rounds must be at least 1, got {args.rounds}")
    try:
        req = bench_ops.request(
            args.op, args.shape, args.dtype, args.device, args.dim, args.backward, args.trace
        )
    except JitopsError as e:  # what was typed cannot be run: usage, exit 2
        raise SystemExit(f"jitops bench: {e}") from e
    _out(*bench_ops.run(req, args.rounds))
    return 0


# ------------------------------------------------------------------ parser


def _target_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument(
            "--device",
            action="append",
            choices=("cpu", "cuda"),
            help="device to build for (repeatable; default: cpu, plus cuda with a GPU or --arch)",
        )
    else:
        p.add_argument(
            "--device",
            choices=("cpu", "cuda"),
            help="device (default: this machine's current device)",
        )
    p.add_argument(
        "--arch",
        metavar="LIST",
        help="CUDA archs, e.g. 8.0,9.0 (default: TORCH_CUDA_ARCH_LIST, else the GPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = argparse.ArgumentParser(
        prog="jitops", description="Build, inspect and manage jitops's kernel cache."
    )
    parser.add_argument("--version", action="version", version=f"jitops {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser(
        "list", help="ops, and every library in the cache, with the targets already cached"
    ).set_defaults(fn=cmd_list)
    p = sub.add_parser("info", help="an op's schemas, sources, key, ingredients and cache path")
    p.add_argument("op", help="an op name (`jitops list` shows them)")
    _target_args(p)
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser("warm", help="build cache entries ahead of time (in parallel)")
    p.add_argument("ops", nargs="*", metavar="OP")
    p.add_argument("--all", action="store_true", help="every known op")
    _target_args(p, many=True)
    p.add_argument(
        "--jobs",
        type=parse_jobs,
        metavar="N",
        help="parallel compiles (default: from cores and free memory)",
    )
    p.add_argument(
        "--strict", action="store_true", help="exit non-zero if any CUDA entry had to be skipped"
    )
    p.add_argument(
        "--push",
        action="store_true",
        help="then sign and upload the entries to JITOPS_REMOTE_CACHE",
    )
    p.set_defaults(fn=cmd_warm)
    p = sub.add_parser("doctor", help="check that builds work here; exit 1 with the fix if not")
    p.add_argument(
        "--recheck",
        action="store_true",
        help="run the toolchain self-check again even if a fresh verdict is remembered",
    )
    p.add_argument(
        "--offline-ready",
        nargs="+",
        metavar="OP",
        help="instead: whether `jitops.get(OP)` would load "
        "each OP here with zero builds (exit 1 if not; builds nothing)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="with --offline-ready: the device (default: get()'s)",
    )
    p.set_defaults(fn=cmd_doctor)
    p = sub.add_parser("explain", help="why this machine would build or rebuild an op")
    p.add_argument("op", help="an op name (`jitops list` shows them)")
    _target_args(p)
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser(
        "bench", help="time an op against torch and its reference on this machine's inputs"
    )
    p.add_argument("op", help="an op name (`jitops list` shows them)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), help="default: cuda when a GPU is usable, else cpu"
    )
    p.add_argument(
        "--shape",
        action="append",
        metavar="SHAPE",
        help="e.g. 4096,4096; repeatable, one row each (nms: the number of boxes; default 4096,4096)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default), bfloat16, float16, float64, int64, ...",
    )
    p.add_argument("--dim", type=int, help="softmax/log_softmax: the dim (default -1)")
    p.add_argument(
        "--backward",
        action="store_true",
        help="time the backward alone (autograd.grad of a kept output)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=15,
        metavar="N",
        help="CPU: paired rounds per case (default 15)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="also write a torch.profiler Chrome trace of every case to FILE",
    )
    p.set_defaults(fn=cmd_bench)
    cli_cache.add_parser(sub, _target_args)
    cli_bundle.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        rc = int(args.fn(args))
        sys.stdout.flush()  # a reader that went away is found here, not at the interpreter's exit
        return rc
    except BrokenPipeError as e:
        if not _stdout_gone():
            print(f"jitops: error: {_one_line(e)}", file=sys.stderr)
            return 1
        _quiet_stdout()
        # as a Unix tool killed by SIGPIPE (128 + 13): `jitops cache ls | head` ends quietly
        return 141
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


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (poll reports an error on it): only
    then is a BrokenPipeError the reader's choice, not a failure of what the command was doing."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no fileno (captured), or no poll here
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so what is still buffered is not written again (and refused) at
    exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


def _one_line(e: BaseException) -> str:
    """A plain OSError as its cause and path, without the errno; jitops's own errors as written."""
    if isinstance(e, OSError) and not isinstance(e, JitopsError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e)
