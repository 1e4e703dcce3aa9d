"""The bundle tier and ``jitops bundle build`` (issue 31).

One real build: ``add`` for the CPU, in the session cache (shared with test_kernels), packed once per module
by ``jitops bundle build`` and pip-installed into a folder. Each use of it runs in a fresh interpreter
(tests/scenarios_bundles.py) with that folder on its path and an empty cache of its own; the tier's logic
(entry points read once, only on a local miss; a broken bundle skipped; nothing written) runs in-process with
the fake builder.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch

import jitops.api.warm as jwarm
import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.cli import main
from jitops.key import compute_key, namespace_for
from jitops.store import bundles
from jitops.store.cache import Cache
from jitops.store.manifest import MANIFEST, Hit, Manifest
from tests.cli_helpers import fake_spec, stripped_path
from tests.helpers import REPO, child_env, run_scenario

NAME = "t31"
PACKAGE = f"jitops_bundle_{NAME}"


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(a config dir holding a key pair, its public key): the key the module's bundle is signed with."""
    from tests.remote_helpers import keygen

    cfg = tmp_path_factory.mktemp("signer") / "config"
    return cfg, keygen(cfg)


@pytest.fixture(scope="module")
def wheel(
    session_cache: Path, tmp_path_factory: pytest.TempPathFactory, signer: tuple[Path, str]
) -> tuple[Path, str]:
    """(the wheel ``jitops bundle build --ops add --sign`` wrote, what it printed): add built for real at most once."""
    out = tmp_path_factory.mktemp("wheel")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("JITOPS_CACHE_DIR", str(session_cache))
        mp.setenv("JITOPS_PROGRESS", "0")
        mp.setenv("JITOPS_CONFIG_DIR", str(signer[0]))
        for var in (
            "JITOPS_FREEZE",
            "JITOPS_BUILDER",
            "JITOPS_OFFLINE",
            "JITOPS_REMOTE_SIGNING_KEY",
        ):
            mp.delenv(var, raising=False)
        rc = main(
            [
                "bundle",
                "build",
                "--ops",
                "add",
                "--out",
                str(out),
                "--name",
                NAME,
                "--version",
                "1.0",
                "--sign",
            ]
        )
    assert rc == 0, printed.getvalue()
    (whl,) = out.glob("*.whl")
    return whl, printed.getvalue()


@pytest.fixture(scope="module")
def installed(wheel: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder pip installed the wheel into (``--target``; on a child's PYTHONPATH it is installed there)."""
    target = tmp_path_factory.mktemp("site") / "T"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel[0]),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def _library(site: Path) -> Path:
    (lib,) = (site / PACKAGE / "v1" / "entries" / "add").glob("*/*/libadd.so")
    return lib


def _snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder`` but byte-code caches: size, mtime, sha256 (so any write shows)."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _child(
    site: Path,
    cache: Path,
    tmp: Path,
    *,
    compiler: bool,
    freeze: bool,
    trusted: str | None = None,
    require_signed: bool = False,
) -> Any:
    """``scenarios_bundles.get_add`` in a fresh interpreter: ``site`` on its path, ``cache`` its (empty) cache;
    without a compiler: CXX=/bin/false and a PATH with no c++, g++, cc or nvcc. ``trusted``: the public key it
    trusts (the bundle's signer unless a test says otherwise); its own config dir holds no key."""
    env = {
        "JITOPS_CACHE_DIR": str(cache),
        "JITOPS_STATE_DIR": str(tmp / "state"),
        "JITOPS_FREEZE": "error" if freeze else None,
        "PYTHONPATH": os.pathsep.join((str(REPO), str(site))),
        "JITOPS_PROGRESS": "0",
        "JITOPS_BUILDER": None,
        "JITOPS_CONFIG_DIR": str(tmp / "config"),
        "JITOPS_REMOTE_TRUSTED_KEYS": trusted,
        "JITOPS_REQUIRE_SIGNED": "1" if require_signed else None,
        "JITOPS_REMOTE_SIGNING_KEY": None,
    }
    full = (
        child_env(PATH=stripped_path(tmp), CXX="/bin/false", CC=None, CUDA_HOME=None, **env)
        if not compiler
        else child_env(**env)
    )
    return run_scenario(
        "scenarios_bundles.get_add", env=full, timeout=240, bundle_root=str(site / PACKAGE)
    )


def _compiles(spawned: list[list[str]]) -> list[list[str]]:
    """The processes started that compile or link (a compiler's identity probes, ``--version`` and
    the dry run ``-###`` that names the programs it runs, are none)."""
    return [
        argv
        for argv in spawned
        if "-###" not in argv
        and any(w in ("-c", "-shared", "-o") or w.endswith("ninja") for w in argv[1:])
    ]


# ------------------------------------------------------------------ (a) the wheel


@pytest.mark.compile
def test_bundle_build_writes_an_installable_wheel(
    wheel: tuple[Path, str], installed: Path, signer: tuple[Path, str]
) -> None:
    whl, printed = wheel
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    # the entries are keyed on both
    assert whl.name == f"{PACKAGE}-1.0-{py}-{py}{sys.abiflags}-{platform}.whl"
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        record = zf.read(f"{PACKAGE}-1.0.dist-info/RECORD").decode().splitlines()
        for line in record:  # every file is in RECORD with its sha256 and size, and matches it
            arc, digest, size = line.rsplit(",", 2)
            if arc.endswith("/RECORD"):
                continue
            data = zf.read(arc)
            assert (
                digest
                == "sha256="
                + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            )
            assert int(size) == len(data)
        assert len(record) == len(names)
        meta = zf.read(f"{PACKAGE}-1.0.dist-info/METADATA").decode()
        lib_arc = next(n for n in names if n.endswith("/libadd.so"))
        manifest = Manifest.parse(zf.read(lib_arc.rpartition("/")[0] + "/" + MANIFEST))
        lib = zf.read(lib_arc)
        signature = tuple(
            zf.read(lib_arc.rpartition("/")[0] + "/" + bundles.SIGNATURE).decode().split()
        )
        manifest_bytes = zf.read(lib_arc.rpartition("/")[0] + "/" + MANIFEST)
    assert f"Requires-Dist: torch=={torch.__version__.split('+')[0]}" in meta.splitlines()
    assert hashlib.sha256(lib).hexdigest() == manifest.sha256 and len(lib) == manifest.size
    # the cache's layout
    assert lib_arc == f"{PACKAGE}/v1/entries/add/{manifest.target}/{manifest.key[:32]}/libadd.so"
    assert PACKAGE in printed and " 1.0 " in printed and "KiB" in printed and "add" in printed
    from jitops.remote.signing import Trust, parse_public

    trust = Trust()
    trust.add(parse_public(signer[1], "test"), "test")
    assert len(signature) == 2 and f"signed  by {signature[0]} (1 of 1 entries)" in printed
    # the entry is signed by the key in the config dir, over its manifest
    trust.verify(manifest_bytes, signature[0], signature[1])
    (dist,) = metadata.distributions(path=[str(installed)])
    (ep,) = [e for e in dist.entry_points if e.group == bundles.GROUP]
    assert (ep.name, ep.value) == (NAME, f"{PACKAGE}:ROOT")
    assert dist.requires == [f"torch=={torch.__version__.split('+')[0]}"]


# ------------------------------------------------------------------ (b) loads with zero builds


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.parametrize("compiler", [False, True], ids=["no-compiler", "compiler"])
def test_installed_bundle_serves_get_with_no_build(
    installed: Path, tmp_path: Path, compiler: bool, signer: tuple[Path, str]
) -> None:
    """Frozen, in an empty cache: the bundle's add is loaded in place (bit-identical to torch.add), nothing is
    compiled, nothing is written into the cache's entries or the bundle. Without a compiler (CXX=/bin/false)
    the entry matches all but the toolchain; with one, by its exact key."""
    before = _snapshot(installed)
    cache = tmp_path / "cache"
    out = _child(installed, cache, tmp_path, compiler=compiler, freeze=True, trusted=signer[1])
    assert "error" not in out, out
    assert out["bit_identical"] == [True, True, True]
    assert out["built"] is False and Path(out["entry"]) == _library(installed).parent
    assert out["mapped_from_bundle"] == [str(_library(installed))]
    assert _compiles(out["spawned"]) == []
    assert out["bundles"] == [f"{PACKAGE} ({NAME})"]
    assert (
        out["explain"]["ready"] and f"(the bundle {PACKAGE} ({NAME}))" in out["explain"]["verdict"]
    )
    # doctor and warm see it too
    assert out["offline_ready"][0] is True and out["warm"] == [
        "cached",
        out["entry"],
    ]
    assert [
        p for p in cache.rglob("*") if p.is_file() and {"entries", "staging"} & set(p.parts)
    ] == []
    assert _snapshot(installed) == before  # nothing written into the bundle (no stamp, no use mark)


# ------------------------------------------------------------------ (c) a tampered bundle


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.parametrize(
    "compiler,freeze,error",
    [(False, True, "FrozenError"), (False, False, "ToolchainError"), (True, True, "FrozenError")],
)
def test_a_flipped_byte_in_the_bundle_is_refused_and_never_loaded(
    installed: Path,
    tmp_path: Path,
    compiler: bool,
    freeze: bool,
    error: str,
    signer: tuple[Path, str],
) -> None:
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    lib = _library(site)
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(bytes(data))
    out = _child(
        site, tmp_path / "cache", tmp_path, compiler=compiler, freeze=freeze, trusted=signer[1]
    )
    assert out.get("error", {}).get("type") == error, out
    assert "JitopsError" in out["error"]["mro"]
    assert (
        f"the bundle {PACKAGE} ({NAME}) refused" in out["error"]["msg"]
        and "sha256" in out["error"]["msg"]
    )
    assert out["mapped_from_bundle"] == []  # never loaded
    # `jitops explain add` says why
    assert not out["explain"]["ready"] and "sha256" in out["explain"]["verdict"]
    assert out["offline_ready"][0] is False and "sha256" in out["offline_ready"][1]
    assert _compiles(out["spawned"]) == []


# ------------------------------------------------------------------ (d) another machine's entry


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.parametrize("compiler", [False, True], ids=["no-compiler", "compiler"])
def test_a_bundle_entry_with_another_key_is_not_used(
    installed: Path, tmp_path: Path, compiler: bool, signer: tuple[Path, str]
) -> None:
    """A sound entry (self-digested, key = its ingredients) built for another torch: not this plan's, never loaded."""
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    entry = _library(site).parent
    m = Manifest.parse((entry / MANIFEST).read_bytes())
    ingredients = {**m.ingredients, "torch_version": "2.99.0"}
    key = compute_key(ingredients)
    other = dataclasses.replace(
        m, ingredients=ingredients, key=key, namespace=namespace_for(m.library, key)
    )
    (entry / MANIFEST).write_bytes(other.to_json())
    moved = entry.rename(entry.parent / key[:32])
    # a valid entry, for another machine
    assert Cache(site / PACKAGE).verify(moved, key, "add", m.target).key == key
    out = _child(
        site, tmp_path / "cache", tmp_path, compiler=compiler, freeze=True, trusted=signer[1]
    )
    assert out.get("error", {}).get("type") == "FrozenError", out
    assert out["mapped_from_bundle"] == []
    # the reason shown
    assert out["explain"]["nearest"] == str(moved) and "torch_version" in out["explain"]["diffs"]


# ------------------------------------------------------------------ (e) signed, unsigned, untrusted


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.parametrize("case", ["trusted", "untrusted", "unsigned"])
def test_with_require_signed_only_a_bundle_signed_by_a_trusted_key_loads(
    installed: Path, tmp_path: Path, case: str, signer: tuple[Path, str]
) -> None:
    """JITOPS_REQUIRE_SIGNED=1, no compiler, frozen: the module's signed bundle loads with zero builds where its key
    is trusted; where another key is, or with its signature files removed, the named error, nothing loaded."""
    from tests.remote_helpers import keygen

    site = installed
    if case == "unsigned":
        site = tmp_path / "site"
        shutil.copytree(installed, site)
        for sig in site.rglob(bundles.SIGNATURE):
            sig.unlink()
    trusted = keygen(tmp_path / "other") if case == "untrusted" else signer[1]
    out = _child(
        site,
        tmp_path / "cache",
        tmp_path,
        compiler=False,
        freeze=True,
        trusted=trusted,
        require_signed=True,
    )
    assert _compiles(out["spawned"]) == []
    if case == "trusted":
        assert "error" not in out, out
        assert out["bit_identical"] == [True, True, True] and out["mapped_from_bundle"] == [
            str(_library(site))
        ]
        return
    assert out.get("error", {}).get("type") == "FrozenError", out
    why = (
        "which this node does not trust"
        if case == "untrusted"
        else "it is unsigned, and JITOPS_REQUIRE_SIGNED=1"
    )
    assert (
        f"the bundle {PACKAGE} ({NAME}) refused" in out["error"]["msg"]
        and why in out["error"]["msg"]
    )
    assert out["mapped_from_bundle"] == []
    # `jitops explain add` says why
    assert not out["explain"]["ready"] and why in out["explain"]["verdict"]


# ------------------------------------------------------ the tier's logic (fake builder, in-process)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each look for the bundles' entry points by the tier (remembered or read), counted; a fresh process's view
    before and after."""
    calls: list[str] = []
    real = bundles._entry_points

    def counting(memo: Any) -> Any:
        calls.append(bundles.GROUP)
        return real(memo)

    monkeypatch.setattr(bundles, "_entry_points", counting)
    bundles.forget()
    yield calls
    bundles.forget()


def test_entry_points_are_read_only_on_a_local_miss_and_once(
    private_cache: Path, tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    hit = jplan.make_plan(fake_spec(tmp_path / "specs", "bundle_hit_op"), "cpu")
    built = jentry.ensure_entry(hit)  # the miss reads the entry points (once), then builds
    assert built.built and counted == [bundles.GROUP]
    bundles.forget()
    counted.clear()
    # a local hit never reads them
    assert isinstance(jentry.entry_status(hit), Hit) and counted == []
    miss = jplan.make_plan(fake_spec(tmp_path / "specs", "bundle_miss_op"), "cpu")
    for _ in range(3):
        assert isinstance(jentry.entry_status(miss), jentry.Miss)
    assert counted == [bundles.GROUP]  # once per process


def test_a_broken_bundle_is_skipped_with_a_warning(
    tmp_path: Path,
    counted: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    site = tmp_path / "site"
    for dist, value in (
        ("jitops_bundle_gone", "jitops_bundle_gone_missing:ROOT"),
        ("jitops_bundle_file", "os:name"),
    ):
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{bundles.GROUP}]\n{dist} = {value}\n")
    monkeypatch.syspath_prepend(str(site))
    with caplog.at_level(logging.WARNING, logger="jitops"):
        assert (
            bundles.installed(
                lambda manifest, signature: pytest.fail("no bundle: nothing is checked")
            )
            == []
        )
    text = caplog.text
    assert "jitops_bundle_gone" in text and "ModuleNotFoundError" in text
    assert "jitops_bundle_file" in text and "is not a package in one folder" in text


def test_a_bundle_cache_refuses_every_write(tmp_path: Path) -> None:
    bundle = bundles.BundleCache(tmp_path, "x (x)", lambda manifest, signature: None)
    with pytest.raises(PermissionError, match="read-only"):
        bundle.new_staging("add", "0" * 64)
    assert not (tmp_path / "v1").exists()


def test_a_bundle_of_stable_abi_entries_requires_torch_from_their_target_on() -> None:
    """The wheel's torch requirement is what the keys hold: the exact torch as soon as one entry is keyed on it;
    ``torch>=`` the oldest target when every entry is on the stable ABI (nms's CPU build: ``OpSpec.for_target``, as make_plan)."""
    from jitops.registry import lookup
    from jitops.spec import STABLE_ABI_FLAG, version_flag
    from jitops.store.bundle_wheel import torch_requirement

    nms = lookup("nms").for_target("cpu", "2.15.0")
    assert STABLE_ABI_FLAG in nms.cflags and version_flag((2, 13)) in nms.cflags
    assert (
        nms.cpu_sources == ("nms_stable.cpp",)
        and nms.cuda_sources == ()
        and nms.exports == ("nms",)
    )
    # a CUDA build: the ATen sources
    assert lookup("nms").for_target("cuda", "2.15.0") is lookup("nms")

    def packed(**ingr: Any) -> Any:  # only the manifest's ingredients are read
        return dataclasses.make_dataclass("P", ["manifest"])(
            dataclasses.make_dataclass("M", ["ingredients"])(ingr)
        )

    stable = {"abi": "stable", "torch_version": None, "cflags": ["-O2", version_flag((2, 13))]}
    newer = {**stable, "cflags": [version_flag((2, 14))]}
    exact = {"torch_version": "2.14.1+cu130", "cflags": ["-O3"]}
    assert torch_requirement([packed(**stable), packed(**newer)], "2.15.0+cpu") == "torch>=2.13"
    assert torch_requirement([packed(**newer)], "2.15.0") == "torch>=2.14"
    assert torch_requirement([packed(**stable), packed(**exact)], "2.14.1+cu130") == "torch==2.14.1"
    assert (
        torch_requirement([packed(abi="stable", torch_version=None, cflags=[])], "2.13.0")
        == "torch==2.13.0"
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--isa", "sse9"], "--isa 'sse9': expected some of default, avx2, avx512"),
        (["--isa", "avx2", "--device", "cuda"], "--isa is for CPU bundles"),
        (["--arch", "9.0"], "--arch is for CUDA bundles"),
        (["--split"], "--split makes one wheel per arch family of --arch"),
        (["--device", "cuda", "--arch", "9.0,sm_77x"], "invalid CUDA arch 'sm_77x'"),
    ],
)
def test_a_wrong_isa_or_arch_list_is_refused_before_any_build(
    private_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(jwarm, "ensure_entry", lambda plan, **kw: built.append(plan.spec.name))
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: pytest.fail("no child is started"))
    rc = main(["bundle", "build", "--ops", "nms", "--out", str(private_cache / "out"), *argv])
    assert rc == 1 and message in capsys.readouterr().err
    assert built == [] and not (private_cache / "out").exists()


def test_an_isa_this_cpu_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's torch reports the ISA it dispatches to; asking for one the CPU lacks gives another: refused,
    naming both. (No CPU here lacks one: the child's reply stands in for an AVX2-only machine's.)"""
    from jitops.cli import bundle as cli_bundle
    from jitops.errors import JitopsError

    seen: list[dict[str, str]] = []

    def child(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append(kw["env"])
        return subprocess.CompletedProcess(argv, 0, stdout="isa AVX2\n")

    monkeypatch.setattr(subprocess, "run", child)
    with pytest.raises(
        JitopsError,
        match="torch on this CPU does not run avx512 code .ATEN_CPU_CAPABILITY=avx512 gave avx2",
    ):
        cli_bundle._warm_in_child(["nms"], "AVX512")
    (env,) = seen
    assert env["ATEN_CPU_CAPABILITY"] == "avx512" and env["PYTHONPATH"].split(os.pathsep)[0] == str(
        REPO
    )


@pytest.mark.compile
@pytest.mark.process
def test_a_bundle_for_several_isas_serves_each_with_no_build(tmp_path: Path) -> None:
    """``--isa default,avx2``: a child process per ISA (``ATEN_CPU_CAPABILITY``) builds nms for it, both entries go
    in one wheel (py3-none: nms is on the stable ABI), and a process whose torch dispatches to either ISA loads its
    own entry with builds forbidden; the indices equal the reference's."""
    if str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"):
        pytest.skip("this CPU has no AVX2")
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_PROGRESS="0",
        JITOPS_FREEZE=None,
        JITOPS_BUILDER=None,
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jitops",
            "bundle",
            "build",
            "--ops",
            "nms",
            "--isa",
            "default,avx2",
            "--out",
            str(tmp_path / "dist"),
            "--name",
            "isas",
            "--version",
            "1",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = (tmp_path / "dist").glob("*.whl")
    assert whl.name.endswith(
        "-py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_") + ".whl"
    )
    assert "(requires torch>=2.13)" in proc.stdout
    with zipfile.ZipFile(whl) as zf:
        targets = sorted(n.split("/")[4] for n in zf.namelist() if n.endswith("/libnms.so"))
    assert targets == ["cpu-avx2", "cpu-default"]
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(whl),
        ],
        check=True,
        timeout=240,
    )
    for isa in ("default", "avx2"):
        run_env = child_env(
            ATEN_CPU_CAPABILITY=isa,
            JITOPS_CACHE_DIR=str(tmp_path / f"empty-{isa}"),
            JITOPS_FREEZE="error",
            JITOPS_STATE_DIR=str(tmp_path / "state"),
            JITOPS_PROGRESS="0",
            JITOPS_BUILDER=None,
            PYTHONPATH=os.pathsep.join((str(REPO), str(site))),
        )
        got = run_scenario("scenarios_bundles.get_nms_here", env=run_env, timeout=240)
        assert (
            got["capability"] == isa.upper() and got["built"] is False and got["same_as_reference"]
        )
        entry = got["entry"]
        assert entry.startswith(str(site)) and f"/entries/nms/cpu-{isa}/" in entry


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--name", "Bad-Name"], "bundle name 'Bad-Name'"),
        (["--version", "1.x"], "bundle version '1.x'"),
    ],
)
def test_a_bad_name_or_version_is_refused_before_any_build(
    private_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(jentry, "ensure_entry", lambda plan, **kw: built.append(plan.spec.name))
    monkeypatch.setattr(jwarm, "ensure_entry", lambda plan, **kw: built.append(plan.spec.name))
    rc = main(["bundle", "build", "--ops", "add", "--out", str(private_cache / "out"), *argv])
    assert rc == 1 and message in capsys.readouterr().err
    assert built == [] and not (private_cache / "out").exists()


# ------------------------------------------------------------ signatures (in-process, fake builder)


def _fake_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[Path, Path, Any]:
    """A fake entry built into a private cache, copied into a bundle folder: (bundle root, its entry, the plan)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(cache))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    plan = jplan.make_plan(fake_spec(tmp_path / "specs", name), "cpu")
    built = jentry.ensure_entry(plan)
    root = tmp_path / "bundle"
    entry = root / built.path.relative_to(cache)
    shutil.copytree(built.path, entry)
    return root, entry, plan


def _key() -> tuple[Any, str]:
    """A fresh Ed25519 signer and its public key's text (what JITOPS_REMOTE_TRUSTED_KEYS takes)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from jitops.remote.signing import Signer, fingerprint, public_text

    key = Ed25519PrivateKey.generate()
    return Signer(key, fingerprint(key.public_key())), public_text(key.public_key())


@pytest.mark.parametrize(
    "case,refusal",
    [
        ("trusted", None),
        ("trusted-required", None),
        ("unsigned", None),
        ("unsigned-required", "it is unsigned, and JITOPS_REQUIRE_SIGNED=1"),
        ("untrusted", "which this node does not trust"),
        ("nothing-trusted", "this machine trusts no key"),
        ("forged", "does not verify"),
        ("garbage", "is not a signature"),
        ("link", "is a symbolic link"),
        ("world-writable", "group- or world-writable"),
    ],
)
def test_a_bundle_entry_s_signature_is_checked_before_it_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, refusal: str | None
) -> None:
    """Each kind of signature (or its absence) through the bundle tier's real check (remote.archive_trust's, as
    build.entry injects it): a refusal is a Miss naming the cause, never a Hit."""
    from jitops.base.settings import Settings
    from jitops.remote.archive_trust import archive_trust

    root, entry, plan = _fake_bundle(tmp_path, monkeypatch, "bundle_signed_op")
    ours, ours_public = _key()
    theirs, _ = _key()
    manifest = (entry / MANIFEST).read_bytes()
    signature = {
        "trusted": ours,
        "trusted-required": ours,
        "untrusted": theirs,
        "nothing-trusted": ours,
        "forged": ours,
        "link": ours,
        "world-writable": ours,
    }.get(case)
    sig_file = entry / bundles.SIGNATURE
    if signature is not None:
        # forged: a signature over other bytes
        signed = manifest + b" " if case == "forged" else manifest
        text = bundles.signature_text((signature.fingerprint, signature.sign(signed)))
        if case == "link":
            (tmp_path / "elsewhere").write_bytes(text)
            sig_file.symlink_to(tmp_path / "elsewhere")
        else:
            sig_file.write_bytes(text)
            sig_file.chmod(0o666 if case == "world-writable" else 0o644)
    elif case == "garbage":
        sig_file.write_bytes(b"not a signature at all\n")
    # no key of the user's own is trusted
    monkeypatch.setenv("JITOPS_CONFIG_DIR", str(tmp_path / "config"))
    # this test's own remembered signatures
    monkeypatch.setenv("JITOPS_STATE_DIR", str(tmp_path / "state"))
    if case != "nothing-trusted":
        monkeypatch.setenv("JITOPS_REMOTE_TRUSTED_KEYS", ours_public)
    if case.endswith("-required"):
        monkeypatch.setenv("JITOPS_REQUIRE_SIGNED", "1")
    bundle = bundles.BundleCache(root, "jitops_bundle_x (x)", archive_trust(Settings.from_env()))
    found = bundle.lookup(plan.address)
    if refusal is None:
        assert isinstance(found, Hit) and found.path == entry, found
    else:
        assert not isinstance(found, Hit)
        assert found.reason is not None and refusal in found.reason, found.reason
        if case == "unsigned-required":
            assert "jitops bundle build --sign" in found.reason  # the fix is named


def test_bundle_build_sign_needs_a_key_and_never_signs_an_imported_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sign` with no key: refused before any build. With a key, an entry this cache imported (its origin note)
    is not re-signed: `--sign` refuses it and writes nothing; without `--sign` it is packed unsigned."""
    from jitops.registry import lookup
    from jitops.remote.origin import note
    from tests.remote_helpers import keygen

    cache, cfg, out = tmp_path / "cache", tmp_path / "config", tmp_path / "out"
    for var, value in (
        ("JITOPS_CACHE_DIR", cache),
        ("JITOPS_CONFIG_DIR", cfg),
        ("JITOPS_BUILDER", "fake"),
        ("JITOPS_PROGRESS", "0"),
    ):
        monkeypatch.setenv(var, str(value))
    built: list[str] = []
    real_warm = jwarm.ensure_entry

    def counting(plan: Any, **kw: Any) -> Any:
        built.append(plan.spec.name)
        return real_warm(plan, **kw)

    monkeypatch.setattr(jwarm, "ensure_entry", counting)
    rc = main(["bundle", "build", "--ops", "add", "--out", str(out), "--sign"])
    assert rc == 1 and "no signing key" in capsys.readouterr().err
    assert built == [] and not out.exists()
    keygen(cfg)
    rc = main(
        [
            "bundle",
            "build",
            "--ops",
            "add",
            "--out",
            str(out),
            "--name",
            "mine",
            "--version",
            "1",
            "--sign",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and "signed  by SHA256:" in printed and "(1 of 1 entries)" in printed, printed
    plan = jplan.make_plan(lookup("add"), "cpu")
    note(
        Cache(cache),
        plan.address,
        "imported",
        "an archive from elsewhere, unsigned",
        (plan.entry / MANIFEST).read_bytes(),
    )
    rc = main(["bundle", "build", "--ops", "add", "--out", str(tmp_path / "out2"), "--sign"])
    assert rc == 1 and "was not built on this machine" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
    rc = main(["bundle", "build", "--ops", "add", "--out", str(tmp_path / "out3")])
    # nothing is signed unasked
    assert rc == 0 and "unsigned (--sign not given)" in capsys.readouterr().out
    (whl,) = (tmp_path / "out3").glob("*.whl")
    with zipfile.ZipFile(whl) as zf:
        assert not [n for n in zf.namelist() if n.endswith("/" + bundles.SIGNATURE)]


def test_a_verified_signature_is_remembered_and_taken_without_cryptography(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first check verifies with Ed25519 and records it in the state dir; a later one (a new check, as in a new
    process) takes the record while the signer is trusted, with `signing` (so `cryptography`) unimportable. Not
    when the signer is no longer trusted, nor from a record others could have written."""
    from jitops.base.settings import Settings
    from jitops.remote.archive_trust import archive_trust

    root, entry, plan = _fake_bundle(tmp_path, monkeypatch, "bundle_memo_op")
    ours, ours_public = _key()
    manifest = (entry / MANIFEST).read_bytes()
    (entry / bundles.SIGNATURE).write_bytes(
        bundles.signature_text((ours.fingerprint, ours.sign(manifest)))
    )
    for var, value in (
        ("JITOPS_CONFIG_DIR", str(tmp_path / "config")),
        ("JITOPS_REMOTE_TRUSTED_KEYS", ours_public),
        ("JITOPS_REQUIRE_SIGNED", "1"),
        ("JITOPS_STATE_DIR", str(tmp_path / "state")),
    ):
        monkeypatch.setenv(var, value)

    def lookup() -> Any:
        return bundles.BundleCache(
            root, "jitops_bundle_x (x)", archive_trust(Settings.from_env())
        ).lookup(plan.address)

    assert isinstance(lookup(), Hit)
    (record,) = (tmp_path / "state" / "verified").glob("*.sig")
    _, theirs_public = _key()
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "jitops.remote.signing", None)  # any import of it raises ImportError
        assert isinstance(lookup(), Hit)
        # a record others could have written is no record: the check needs cryptography
        record.chmod(0o666)
        found = lookup()
        assert not isinstance(found, Hit) and "needs the `cryptography` package" in str(
            found.reason
        )
        record.chmod(0o644)
        # the signer is no longer trusted: said so,
        monkeypatch.setenv("JITOPS_REMOTE_TRUSTED_KEYS", theirs_public)
        found = lookup()  # without cryptography, whatever the record says
        assert not isinstance(found, Hit) and "which this node does not trust" in str(found.reason)


def test_the_tier_injects_the_signature_check_and_never_imports_a_bundle(
    tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``entry_status``, as ``get`` asks: an installed bundle (a dist-info naming a package) whose entry is
    signed by an untrusted key is refused with the reason; its package's code never runs (it would raise)."""
    root, entry, plan = _fake_bundle(tmp_path, monkeypatch, "bundle_ep_op")
    site = tmp_path / "site"
    package = site / "jitops_bundle_ep"
    shutil.copytree(root, package)
    (package / "__init__.py").write_text("raise SystemExit('a bundle package was imported')\n")
    info = site / "jitops_bundle_ep-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jitops_bundle_ep\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{bundles.GROUP}]\nep = jitops_bundle_ep:ROOT\n")
    signer, _ = _key()
    bundled = package / entry.relative_to(root)
    manifest = (bundled / MANIFEST).read_bytes()
    (bundled / bundles.SIGNATURE).write_bytes(
        bundles.signature_text((signer.fingerprint, signer.sign(manifest)))
    )
    shutil.rmtree(plan.entry)  # the local cache misses: the bundle is asked
    monkeypatch.syspath_prepend(str(site))
    # the fake build's miss read the entry points before the bundle was on the path
    bundles.forget()
    for var, value in (
        ("JITOPS_CONFIG_DIR", str(tmp_path / "config")),
        ("JITOPS_REMOTE_TRUSTED_KEYS", _key()[1]),
        ("JITOPS_STATE_DIR", str(tmp_path / "state")),
    ):
        monkeypatch.setenv(var, value)
    status = jentry.entry_status(plan)
    assert isinstance(status, jentry.Damaged), status
    assert (
        "the bundle jitops_bundle_ep (ep) refused" in status.reason
        and "does not trust" in status.reason
    )
    assert "jitops_bundle_ep" not in sys.modules
    # each check reads the environment as it is then
    monkeypatch.setenv("JITOPS_REMOTE_TRUSTED_KEYS", "")
    monkeypatch.setenv("JITOPS_REQUIRE_SIGNED", "1")
    (bundled / bundles.SIGNATURE).unlink()
    status = jentry.entry_status(plan)
    assert (
        isinstance(status, jentry.Damaged)
        and "it is unsigned, and JITOPS_REQUIRE_SIGNED=1" in status.reason
    )
    monkeypatch.delenv("JITOPS_REQUIRE_SIGNED")
    found = jentry.entry_status(plan)
    # unsigned, not required: the bundle's entry
    assert isinstance(found, Hit) and found.path == bundled


def test_the_entry_points_found_are_remembered_for_the_same_import_path_and_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A second process (``forget``) with the same import path and distributions takes the remembered answer and
    reads no distribution's entry points; a bundle installed since is read and found; so is another import path,
    and the first path's record still holds after it; offline nothing is remembered; an import path that cannot be
    listed (a Path entry, a deleted working directory) is read in full; a package of the bundle's name earlier on
    the path than the one its distribution installed is refused, never taken for it."""
    from jitops.store.stamps import Stamps

    reads: list[int] = []
    real = metadata.entry_points

    def reading(**kwargs: Any) -> Any:
        reads.append(1)
        return real(**kwargs)

    monkeypatch.setattr(bundles.metadata, "entry_points", reading)
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site)])  # an import path this test alone changes
    memo = Stamps(lambda: tmp_path / "state")

    def names(stamps: Stamps | None = memo) -> list[str]:
        bundles.forget()
        return [b.name for b in bundles.installed(lambda manifest, signature: None, stamps)]

    assert names() == [] and len(reads) == 1
    (site / "unrelated.txt").write_text(
        "a file that is no distribution's metadata changes nothing\n"
    )
    assert names() == [] and len(reads) == 1  # remembered: no distribution read
    package = site / "jitops_bundle_mem"
    (package / "v1").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('never imported')\n")
    info = site / "jitops_bundle_mem-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jitops_bundle_mem\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{bundles.GROUP}]\nmem = jitops_bundle_mem:ROOT\n")
    # installed since: read again, found
    assert names() == ["jitops_bundle_mem (mem)"] and len(reads) == 2
    assert names() == ["jitops_bundle_mem (mem)"] and len(reads) == 2
    other = tmp_path / "other"
    other.mkdir()
    sys.path.append(str(other))  # another import path
    assert names() == ["jitops_bundle_mem (mem)"] and len(reads) == 3
    sys.path.remove(str(other))  # back to the first import path: its own record still holds
    assert names() == ["jitops_bundle_mem (mem)"] and len(reads) == 3
    assert len(list((tmp_path / "state" / "verified").glob("*.bundles"))) == 2
    offline = Stamps(lambda: tmp_path / "state-offline", write=False)
    assert (
        names(offline) == ["jitops_bundle_mem (mem)"] and not (tmp_path / "state-offline").exists()
    )
    path_entries: list[Any] = sys.path
    path_entries.append(other)  # a Path where a str belongs: read in full, no crash
    assert names() == ["jitops_bundle_mem (mem)"]
    path_entries.remove(other)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    sys.path.insert(0, "")  # the working directory, deleted: read in full, no crash
    before = len(reads)
    assert names() == ["jitops_bundle_mem (mem)"] and len(reads) == before + 1
    monkeypatch.chdir(tmp_path)
    sys.path.remove("")
    shadow = tmp_path / "shadow"
    (shadow / "jitops_bundle_mem" / "v1").mkdir(parents=True)
    (shadow / "jitops_bundle_mem" / "__init__.py").write_text("")
    sys.path.insert(0, str(shadow))  # another folder of the bundle's name comes first
    with caplog.at_level(logging.WARNING, logger="jitops"):
        assert names() == []
    assert "not the folder its distribution installed" in caplog.text
    bundles.forget()
