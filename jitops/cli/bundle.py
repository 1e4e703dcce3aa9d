"""``jitops bundle build``: warm the named ops, then write their verified entries as a wheel (store.bundle_wheel)
that pip installs and the bundle tier (store.bundles) loads from with zero builds.

``--sign``: each entry built here is signed with this machine's key (``jitops cache keygen``, or
JITOPS_REMOTE_SIGNING_KEY), an entry taken from an installed bundle keeps that bundle's signature (checked again),
and an entry that cannot be signed (imported, or an unsigned bundle's) is an error before anything is written.
Without it nothing is signed: a signed bundle needs its key trusted (and ``cryptography``) wherever it loads.

``--isa``: entries for several of the CPU ISAs torch dispatches to, so one wheel serves machines with older CPUs
too: each ISA other than this process's is built by ``jitops warm`` in a child whose ``ATEN_CPU_CAPABILITY``
names it (torch reads it at import), into the same cache; every entry is then planned for its ISA here
(``make_plan(isa=)``) and verified as any other before it is packed.

``--arch``: CUDA entries for the archs named, one single-arch entry per op and arch: the entry a GPU of that arch
plans by default (its own compute capability), so each node loads just the code it runs. ``--split``: one wheel per
arch family (``jitops_bundle_NAME_sm9x`` holds the 9.x entries), so a node installs only its GPU's and no wheel
grows with every arch (FlashInfer's had to be split per GPU family at 9 GB).

Imports: errors, base.settings; lazily api.warm, cli (``main``, in the child), build.entry, build.runner, plan, registry, remote.archive_trust,
store.bundle_wheel, store.bundles, store.manifest, target.archs (``--arch``), torch (its version).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..base.settings import Settings
from ..errors import JitopsError


def cmd_bundle(args: argparse.Namespace) -> int:
    from ..api import warm
    from ..build.entry import Compatible, entry_status
    from ..build.runner import default_jobs
    from ..plan import make_plan
    from ..registry import lookup
    from ..remote.archive_trust import entry_signer
    from ..store import bundles
    from ..store.bundle_wheel import Packed, check_version, package_name, write_wheel
    from ..store.manifest import Address, Hit

    import torch

    settings = Settings.from_env()
    version = check_version(args.version or time.strftime("%Y.%m.%d.%H%M%S", time.gmtime()))
    package_name(args.name)  # both checked before anything is built, and so is the key --sign needs
    sign_here, signer = entry_signer(settings) if args.sign else (None, "--sign not given")
    if args.sign and sign_here is None:
        raise JitopsError(f"jitops bundle build --sign: nothing was built or written: {signer}")
    names = [n for n in (s.strip() for s in args.ops.split(",")) if n]
    if not names:
        raise SystemExit("jitops bundle build: name the ops, e.g. --ops add,softmax")
    specs = list(dict.fromkeys(lookup(n) for n in names))
    tasks = warm.tasks_for(specs, [args.device])
    if len(tasks) != len(specs):
        missing = sorted({s.name for s in specs} - {t.spec.name for t in tasks})
        raise JitopsError(
            f"jitops bundle build: {', '.join(missing)} have no {args.device} sources"
        )
    here = str(torch.backends.cpu.get_cpu_capability())
    isas = _isas(args.isa, args.device, here)
    archs = _archs(args.arch, args.device, args.split)
    if here in isas:
        for arch in archs:
            outcomes = warm.warm(
                tasks, archs=arch, jobs=default_jobs(settings.jobs), settings=settings
            )
            failed = [
                f"{o.task.what} ({o.target}): {o.message}"
                for o in outcomes
                if o.status in ("failed", "skipped")
            ]
            if failed:
                raise JitopsError(
                    "jitops bundle build: nothing was written; these entries could not be made: "
                    + "; ".join(failed)
                )
    for isa in isas:
        if isa != here:
            _warm_in_child(names, isa)
    groups: dict[str, list[Packed]] = {}  # wheel name -> its entries
    for task in tasks:
        for isa in isas:
            for arch in archs:
                plan = make_plan(
                    task.spec,
                    task.device,
                    arch,
                    settings=settings,
                    isa=None if isa == here else isa,
                )
                # verified again: only what would load on such a machine is packed
                status = entry_status(plan)
                if isinstance(status, Hit):
                    p = Packed(
                        bundles.holding(status.path) or plan.cache, status.path, status.manifest
                    )
                elif isinstance(status, Compatible):
                    p = Packed(status.plan.cache, status.path, status.manifest)
                else:
                    raise JitopsError(
                        f"jitops bundle build: {task.what} ({plan.target.name}) has no verified entry "
                        f"after warming ({status})"
                    )
                groups.setdefault(
                    f"{args.name}_{_family(arch)}" if args.split and arch else args.name, []
                ).append(p)

    def sign(p: Packed, manifest: bytes) -> tuple[str, str] | None:
        # another bundle's entry: its own signature, checked again
        if isinstance(p.cache, bundles.BundleCache):
            got = bundles.read_signature(p.entry / bundles.SIGNATURE, p.cache.owners)
            if got is not None:
                p.cache.check(manifest, got)
            elif sign_here is not None:
                raise JitopsError(
                    f"jitops bundle build --sign: nothing was written: {p.manifest.library} comes from "
                    f"the unsigned bundle {p.cache.name}, and jitops signs only what it built. Fix: pip "
                    "uninstall that bundle and run this again (it builds here), or leave out --sign"
                )
        else:
            address = Address(p.manifest.library, p.manifest.target, p.manifest.key)
            got = sign_here(p.cache, address, manifest) if sign_here is not None else None
            if got is None and sign_here is not None:
                raise JitopsError(
                    f"jitops bundle build --sign: nothing was written: {p.entry} was not built on this "
                    "machine (it was imported), and jitops signs only what it built. Fix: `jitops cache "
                    "clear`, then run this again to build it here, or leave out --sign"
                )
        return got if sign_here is not None else None

    for name in groups:
        package_name(name)  # every wheel's name checked before the first is written
    for name, packed in groups.items():
        written = write_wheel(packed, Path(args.out), name, version, torch.__version__, sign)
        print(
            f"bundle  {written.distribution} {written.version} ({written.size / 1024:.0f} KiB): {written.path}"
        )
        for library, size in sorted(written.per_library.items()):
            print(f"  {library:<16} {size / 1024:>8.0f} KiB uncompressed")
        signed = [s for s in written.signers.values() if s is not None]
        if signed:
            print(
                f"signed  by {', '.join(sorted(set(signed)))} ({len(signed)} of {len(written.signers)} entries)"
            )
        else:
            print(f"unsigned ({signer})")
        print(f"install: pip install --no-deps {written.path}  (requires {written.requires})")
    return 0


# torch's CPU capabilities on x86 (ATEN_CPU_CAPABILITY), lowest first
ISAS = (
    "DEFAULT",
    "AVX2",
    "AVX512",
)


def _isas(text: str | None, device: str, here: str) -> list[str]:
    """``--isa``'s ISAs (``all``: every one up to the one this process's torch dispatches to), this one's when not given."""
    if text is None:
        return [here]
    if device != "cpu":
        raise JitopsError(
            "jitops bundle build: --isa is for CPU bundles (a CUDA entry's host code follows the "
            "machine that builds it). Fix: leave out --isa, or --device cpu"
        )
    names = [w.strip().upper() for w in text.split(",") if w.strip()]
    if names == ["ALL"]:
        return list(ISAS[: ISAS.index(here) + 1]) if here in ISAS else [here]
    wrong = [n for n in names if n not in ISAS]
    if wrong or not names:
        raise JitopsError(
            f"jitops bundle build: --isa {text!r}: expected some of {', '.join(i.lower() for i in ISAS)} "
            "(torch's ATEN_CPU_CAPABILITY names), or all. Fix: e.g. --isa default,avx2"
        )
    return list(dict.fromkeys(names))


def _archs(text: str | None, device: str, split: bool) -> list[str | None]:
    """``--arch``'s archs, one single-arch list each (``[None]``, the default plan's, when not given)."""
    if text is None:
        if split:
            raise JitopsError(
                "jitops bundle build: --split makes one wheel per arch family of --arch. Fix: name the "
                "archs, e.g. --device cuda --arch 8.0,9.0 --split"
            )
        return [None]
    if device != "cuda":
        raise JitopsError(
            "jitops bundle build: --arch is for CUDA bundles. Fix: add --device cuda, or leave out --arch"
        )
    from ..target.archs import parse_arch_list

    return list(parse_arch_list(text))  # TargetError names a word it does not know


def _family(arch: str) -> str:
    """The wheel suffix of an arch's family: ``sm9x`` for 9.0, 9.0a and 9.0+PTX."""
    return f"sm{arch.split('.')[0]}x"


def _warm_in_child(names: list[str], isa: str) -> None:
    """Build the ops' CPU entries for ``isa`` in a child process whose torch dispatches to it
    (``ATEN_CPU_CAPABILITY``), with this jitops first on its path, into the same cache; its output is shown.
    JitopsError if this CPU cannot run it, or a build fails or takes over an hour."""
    import os
    import subprocess
    import sys

    import jitops

    root = str(Path(jitops.__file__).resolve().parent.parent)
    code = (
        "import sys, torch; print('isa', torch.backends.cpu.get_cpu_capability(), flush=True); "
        "from jitops.cli import main; sys.exit(main(['warm', *sys.argv[1:], '--device', 'cpu']))"
    )
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": isa.lower(),
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
    }
    print(
        f"warming {', '.join(names)} for {isa.lower()} in a child process (ATEN_CPU_CAPABILITY={isa.lower()})",
        flush=True,
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *names],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            timeout=3600,
        )
    except subprocess.TimeoutExpired:
        raise JitopsError(
            f"jitops bundle build: nothing was written; warming for {isa.lower()} took over an hour. "
            f"Fix: run `ATEN_CPU_CAPABILITY={isa.lower()} jitops warm ...` to see where it stops"
        ) from None
    print(proc.stdout, end="", flush=True)
    got = next(
        (line.split()[1] for line in proc.stdout.splitlines() if line.startswith("isa ")), None
    )
    if got is not None and got != isa:
        raise JitopsError(
            f"jitops bundle build: nothing was written: torch on this CPU does not run {isa.lower()} "
            f"code (ATEN_CPU_CAPABILITY={isa.lower()} gave {got.lower()}). Fix: build that part of the "
            "bundle on a machine whose CPU has it, or leave it out of --isa"
        )
    if proc.returncode != 0:
        raise JitopsError(
            f"jitops bundle build: nothing was written; warming for {isa.lower()} failed "
            f"(exit {proc.returncode}; its output is above)"
        )


def add_parser(sub: Any) -> None:
    """``jitops bundle build``, under the main parser's subcommands ``sub``."""
    p = sub.add_parser("bundle", help="write prebuilt, verified entries as an installable wheel")
    bs = p.add_subparsers(dest="bundle_cmd", required=True, metavar="ACTION")
    q = bs.add_parser(
        "build", help="warm the ops, then write their entries as a wheel (jitops_bundle_NAME)"
    )
    q.add_argument("--ops", required=True, metavar="A,B", help="the ops, comma-separated")
    q.add_argument("--out", required=True, metavar="DIR", help="folder to write the wheel into")
    q.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="the target (default: cpu)"
    )
    q.add_argument(
        "--isa",
        metavar="A,B",
        help="CPU ISAs to hold entries for: default, avx2, avx512 (torch's "
        "ATEN_CPU_CAPABILITY names), or all up to the one torch dispatches to here (default: that one)",
    )
    q.add_argument(
        "--arch",
        metavar="A,B",
        help="CUDA archs (TORCH_CUDA_ARCH_LIST words: 8.0,9.0,9.0a), an entry per "
        "op and arch, each what a GPU of that arch loads (default: this machine's GPU's, or "
        "TORCH_CUDA_ARCH_LIST)",
    )
    q.add_argument(
        "--split",
        action="store_true",
        help="with --arch: one wheel per arch family "
        "(jitops_bundle_NAME_sm8x, _sm9x, ...), so a node installs only its GPU's",
    )
    q.add_argument(
        "--name", default="ops", help="the bundle's name: package jitops_bundle_NAME (default: ops)"
    )
    q.add_argument(
        "--version", help="the wheel's version (default: the UTC time, YYYY.MM.DD.HHMMSS)"
    )
    q.add_argument(
        "--sign",
        action="store_true",
        help="sign every entry with this machine's key (`jitops cache keygen`), or write nothing",
    )
    q.set_defaults(fn=cmd_bundle)
