"""Security: foreign, writable or symlinked caches are never loaded; hostile names never
reach the filesystem; builds start argv lists only; the build environment is keyed or scrubbed.

Tests and CI run as root, and root may read anything, so ownership and
permission cases run in a child that dropped to uid/gid 65534 (nobody) before
importing jitops. The entry it must refuse is otherwise perfect (its manifest
matches the library) and its library writes a marker file if loaded.
"""

from __future__ import annotations

import ast
import os
import pickle
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jitops import target
import jitops.key as jkey
from tests.helpers import NOBODY, REPO, child_env, run_as_nobody, run_scenario, tattletale_library

pytestmark = pytest.mark.process
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")


# Each case: (name, how the test damages trust after nobody built a perfect entry).
CASES = [
    "root-owned-by-other",
    "entry-owned-by-other",
    "library-owned-by-other",
    "manifest-owned-by-other",
    "root-group-writable",
    "root-world-writable",
    "v1-world-writable",
    "entry-world-writable",
    "library-group-writable",
    "root-is-symlink",
    "v1-is-symlink",
    "entry-is-symlink",
    "target-dir-is-symlink",
]


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory nobody can reach and owns (pytest's tmp_path lives under a 0700 dir)."""
    base = Path(tempfile.mkdtemp(prefix="jitops-sec-"))
    os.chmod(base, 0o755)
    (base / "sec").mkdir()
    os.chown(base / "sec", NOBODY, NOBODY)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_root
@pytest.mark.timeout(300)
def test_untrusted_cache_is_never_loaded(nobody_dir: Path) -> None:
    tmp_path = nobody_dir
    base = tmp_path / "sec"
    marker = base / "PLANTED-LIBRARY-RAN"
    evil = tattletale_library(tmp_path, marker, mode=0o666)
    os.chmod(evil, 0o755)
    built = run_as_nobody(
        base,
        "scenarios_damage.build_pristine",
        child_env(JITOPS_BUILDER="fake", TMPDIR=str(base)),
        base=str(base),
    )
    assert built == "built"
    # As root: copy the pristine cache per case, plant the tattletale with a matching manifest,
    # break trust.
    pristine = base / "pristine"
    for case in CASES:
        cache = base / case
        subprocess.run(["cp", "-a", str(pristine), str(cache)], check=True)
        (entry,) = (cache / "v1" / "entries").glob("*/*/*")
        lib = entry / "libfakeadd.so"
        data = evil.read_bytes()
        lib.write_bytes(data)
        m = _manifest_for(entry / "manifest.json", data)
        (entry / "manifest.json").write_bytes(m)
        _break(case, cache, entry, tmp_path)
    rows = dict(
        run_as_nobody(
            base,
            "scenarios_damage.get_from_each_cache",
            child_env(JITOPS_BUILDER="fake", TMPDIR=str(base)),
            base=str(base),
            cases=CASES,
            strict_case="root-owned-by-other",
        )
    )
    assert not marker.exists(), "a library from an untrusted cache ran"
    for case in CASES:
        r = rows[case]
        if case == "entry-owned-by-other":  # nobody may not move root's directory out of the way
            assert r["type"] == "CacheError" and "Fix: remove that directory" in r["msg"], r
            continue
        assert r["ok"] and r["value"]["works"] and r["value"]["built"], (case, r)
    strict = rows["strict"]
    assert strict["type"] == "CacheError" and "fakeadd" in strict["msg"] and "Fix:" in strict["msg"]


def _manifest_for(path: Path, data: bytes) -> bytes:
    import dataclasses
    import hashlib

    from jitops.store.manifest import Manifest

    m = Manifest.parse(path.read_bytes())
    return dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest(), size=len(data)).to_json()


def _break(case: str, cache: Path, entry: Path, tmp_path: Path) -> None:
    v1 = cache / "v1"
    if case == "root-owned-by-other":
        subprocess.run(["chown", "-R", "0:0", str(cache)], check=True)
        os.chmod(cache, 0o755)
    elif case == "entry-owned-by-other":
        os.chown(entry, 0, 0)
        os.chmod(entry, 0o755)
    elif case in ("library-owned-by-other", "manifest-owned-by-other"):
        f = entry / ("libfakeadd.so" if case.startswith("library") else "manifest.json")
        os.chown(f, 0, 0)
        os.chmod(f, 0o755 if case.startswith("library") else 0o644)
    elif case == "root-group-writable":
        os.chmod(cache, 0o770)
    elif case == "root-world-writable":
        os.chmod(cache, 0o777)
    elif case == "v1-world-writable":
        os.chmod(v1, 0o777)
    elif case == "entry-world-writable":
        os.chmod(entry, 0o777)
    elif case == "library-group-writable":
        os.chmod(entry / "libfakeadd.so", 0o770)
    elif case in ("root-is-symlink", "v1-is-symlink", "entry-is-symlink", "target-dir-is-symlink"):
        victim = {
            "root-is-symlink": cache,
            "v1-is-symlink": v1,
            "entry-is-symlink": entry,
            "target-dir-is-symlink": entry.parent,
        }[case]
        real = victim.with_name(victim.name + ".real")
        victim.rename(real)
        victim.symlink_to(real)
        os.lchown(victim, NOBODY, NOBODY)
    else:
        raise AssertionError(case)


HOSTILE = [
    "",
    "../x",
    "..",
    ".",
    "/abs",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "x\0",
    "\0",
    "soft\0max",
    "a\nb",
    "softmax\n",
    "a\rb",
    "a\tb",
    "a b",
    " softmax",
    "softmax ",
    "$(id)",
    "`id`",
    "a;rm -rf ~",
    "a|b",
    "a&b",
    "a>b",
    "~",
    "~root",
    "%2e%2e",
    "a*",
    "a?",
    "[a]",
    "{a,b}",
    "'a'",
    '"a"',
    "a" * 65,
    "a" * 256,
    "a" * 5000,
    "Softmax",
    "SOFTMAX",
    "1abc",
    "_x",
    "-x",
    "a-b",
    "a.b",
    "a.so",
    "s\u043eftmax",
    "\u0455oftmax",
    "\uff53oftmax",
    "softmax\u200b",
    "softmax\u0301",
    "stra\u00dfe",
    "caf\u00e9",
    "\u212bngstrom",
    "\U0001f600",
    "\x7f",
    "a:b",
    "a=b",
    "a@b",
    None,
    b"softmax",
    123,
    ["softmax"],
    Path("softmax"),
]


def test_hostile_names_rejected_before_any_file_access() -> None:
    """>= 30 hostile names: InvalidNameError from get(), reference() and OpSpec(), with no
    file access, import or subprocess in between (audit hook)."""
    assert len(HOSTILE) >= 30
    events, rejected = run_scenario(
        "scenarios_inert.hostile_names", pickled_hex=pickle.dumps(HOSTILE).hex()
    )
    assert events == []
    assert rejected == [True] * (4 * len(HOSTILE))


def test_build_subprocesses_are_argv_lists_with_scrubbed_env(tmp_path: Path) -> None:
    """Every process a cold build starts is an argv list (never a shell), and its environment
    carries none of the scrubbed variables even when the user's has them."""
    scrubbed = {v: "/evil" for v in jkey.SCRUBBED_ENV_VARS}
    seen = run_scenario(
        "scenarios_damage.build_subprocesses",
        env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(tmp_path / "c"), **scrubbed),
    )
    assert len(seen) >= 2  # `c++ --version` and the supervised build
    for _exe, argv, env in seen:
        assert (
            isinstance(argv, list)
            and argv
            and os.path.basename(argv[0]) not in ("sh", "bash", "dash", "zsh")
        )
        if env is not None:
            assert not set(env) & set(scrubbed), set(env) & set(scrubbed)


def test_no_shell_anywhere_in_jitops() -> None:
    """Static check: no shell=True, os.system, os.popen or os.exec* in the package."""
    offenders = []
    for path in (REPO / "jitops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "shell":
                offenders.append(f"{path.name}:{node.lineno} shell=")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and (node.attr in ("system", "popen") or node.attr.startswith(("exec", "spawn")))
            ):
                offenders.append(f"{path.name}:{node.lineno} os.{node.attr}")
    assert offenders == []


def _key_with(environ: dict[str, str], device: str = "cpu") -> str:
    from jitops.key import compute_key
    from jitops.kernels import BUILTINS

    system = target.probe(environ, cuda=False)
    spec = BUILTINS[0]
    tgt = (
        target.choose_target(system, "cpu")
        if device == "cpu"
        else target.Target("cuda", "AVX2", ("9.0",))
    )
    ingr = jkey.ingredients(spec, tgt, system, None, None, {"x.cpp": "0" * 64})
    return compute_key(ingr)


@pytest.mark.parametrize("var", target.BUILD_ENV_VARS)
def test_every_build_env_var_changes_the_key(var: str) -> None:
    # CUDA-only variables reach CUDA keys only
    device = "cuda" if var in target.CUDA_ENV_VARS else "cpu"
    assert _key_with({var: "1"}, device) != _key_with({}, device)


# Variables torch.utils.cpp_extension reads that cannot change a jitops binary, and why.
_HARMLESS = {
    "MAX_JOBS": "parallelism only",
    "PATH": "jitops pins the compiler and nvcc paths (in the key) into the ninja file",
    "TORCH_EXTENSIONS_DIR": "jitops never uses cpp_extension's build directory",
    "TORCH_DONT_CHECK_COMPILER_ABI": "a warning only",
    "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "dependency files only",
    "TORCH_NO_COMPILER_WRAPPER": "jitops replaces the cxx line, so no ccache wrapper is used",
    "PYTORCH_ROCM_ARCH": "ROCm only; jitops builds CPU and CUDA",
    "ROCM_HOME": "ROCm only",
    "ROCM_PATH": "ROCm only",
    "TORCH_XPU_ARCH_LIST": "XPU only",
    "VCT": "Windows only",
    "VSCMD_ARG_TGT_ARCH": "Windows only",
    "WINDOWS_CUDA_HOME": "Windows only",
}


def test_env_vars_cpp_extension_reads_are_keyed_scrubbed_or_harmless() -> None:
    """Scans torch.utils.cpp_extension (which writes the ninja file in-process) for every
    variable it reads; each must be in the key, scrubbed, or listed here as harmless."""
    import re

    import torch.utils.cpp_extension as ce

    src = Path(ce.__file__).read_text()
    read = set(re.findall(r"os\.(?:environ\.get|getenv)\(\s*['\"]([A-Z_]+)", src))
    read |= set(re.findall(r"os\.environ\[['\"]([A-Z_]+)", src))
    read |= set(re.findall(r"['\"]([A-Z_]+)['\"] in os\.environ", src))
    covered = set(target.BUILD_ENV_VARS) | set(jkey.SCRUBBED_ENV_VARS) | set(_HARMLESS)
    assert read, "the scan found nothing; the pattern is stale"
    assert sorted(read - covered) == []


def test_scrubbed_vars_leave_the_build_env() -> None:
    from jitops.build import publish

    env = {**os.environ, **{v: "/evil" for v in jkey.SCRUBBED_ENV_VARS}}
    old = dict(os.environ)
    try:
        os.environ.update(env)
        built = publish.build_env(Path("/staging/tmp"))
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert not set(built) & set(jkey.SCRUBBED_ENV_VARS)
    # compiler temp files stay in staging
    assert built["TMPDIR"] == built["TMP"] == built["TEMP"] == "/staging/tmp"


@needs_root
@pytest.mark.timeout(120)
def test_unreachable_cache_as_nobody(nobody_dir: Path) -> None:
    """A cache nobody cannot even reach (under a root 0700 dir): one warning and a private
    build, not a PermissionError; JITOPS_STRICT=1 gives a CacheError."""
    private = nobody_dir / "rootonly"
    private.mkdir(mode=0o700)
    lenient, strict = run_as_nobody(
        nobody_dir / "sec",
        "scenarios_damage.unreachable_cache",
        child_env(
            JITOPS_BUILDER="fake",
            TMPDIR=str(nobody_dir / "sec"),
            JITOPS_CACHE_DIR=str(private / "c"),
        ),
    )
    assert lenient["ok"] and lenient["value"]["values"] == [True, True], lenient
    assert (
        len(lenient["value"]["warnings"]) == 1
        and "Permission denied" in lenient["value"]["warnings"][0]
    )
    assert strict["type"] == "CacheError" and "fakeadd" in strict["msg"] and "Fix:" in strict["msg"]
    assert os.listdir(private) == []
