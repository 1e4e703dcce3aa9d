"""Tier 1: names, registry, key, targets, inert import. No compiler."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

import jitops
from jitops.target import toolchain
from jitops.target.archs import parse_arch_list
from jitops import spec, target
import jitops.key as jkey
import jitops.store.manifest as jmanifest
from jitops.base.settings import Settings
from jitops.errors import InvalidNameError, JitopsError, TargetError, UnknownOpError
from tests.helpers import REPO, child_env, run_scenario

SOFTMAX = next(
    s for s in __import__("jitops.kernels", fromlist=["BUILTINS"]).BUILTINS if s.name == "softmax"
)

BASE_SYSTEM = target.System(
    torch_version="2.13.0+cpu",
    torch_git_version="abc",
    torch_cuda=None,
    cxx11_abi=True,
    python_abi="cpython-311-x86_64-linux-gnu",
    platform="linux",
    machine="x86_64",
    cpu_capability="AVX512",
)
CXX = toolchain.Tool("cxx", "/usr/bin/g++-12", "g++ (Debian 12.2.0-14) 12.2.0")
NVCC = toolchain.Tool(
    "nvcc", "/usr/local/cuda/bin/nvcc", "Cuda compilation tools, release 13.0, V13.0.48"
)


def key_of(
    spec_: spec.OpSpec = SOFTMAX,
    system: target.System = BASE_SYSTEM,
    tgt: target.Target | None = None,
    cxx: toolchain.Tool | None = CXX,
    nvcc: toolchain.Tool | None = None,
    digests: dict | None = None,
    builder: str = "real",
) -> str:
    tgt = tgt or target.choose_target(system, "cpu")
    digests = (
        digests if digests is not None else {"softmax_cpu.cpp": "a" * 64, "register.cpp": "b" * 64}
    )
    return jkey.compute_key(jkey.ingredients(spec_, tgt, system, cxx, nvcc, digests, builder))


# ------------------------------------------------------------------ names

HOSTILE = [
    "",
    "../x",
    "/abs",
    "a/b",
    "x\x00y",
    "x\ny",
    "soft max",
    "Softmax",
    "sоftmax",
    "ѕoftmax",
    "a" * 65,
    "a" * 256,
    "$(id)",
    "`id`",
    "x;rm",
    "_x",
    "1x",
    "x-y",
    "x.y",
    "~x",
    "..",
    ".",
    "x\\y",
    "x*",
    "x?",
    "é",
    "x\t",
    " x",
    "x ",
    "%2e%2e",
    None,
    3,
    b"softmax",
]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_hostile_names_are_rejected(name: object) -> None:
    with pytest.raises(InvalidNameError) as e:
        spec.validate_name(name)
    assert "must match" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, JitopsError)


def test_unknown_op_suggests_and_is_a_keyerror() -> None:
    with pytest.raises(KeyError) as e:
        jitops.get("sofmax")
    assert isinstance(e.value, UnknownOpError)
    assert "did you mean 'softmax'" in str(e.value)


def test_list_ops_lists_builtins() -> None:
    assert {"softmax", "log_softmax"} <= set(jitops.list_ops())


def test_spec_is_immutable_and_validated(tmp_path: Path) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SOFTMAX.name = "x"  # type: ignore[misc]
    with pytest.raises(InvalidNameError):
        spec.OpSpec(name="../evil", root=tmp_path, cpu_sources=("a.cpp",), exports=("x",))
    with pytest.raises(InvalidNameError):
        spec.OpSpec(name="ok", root=tmp_path, cpu_sources=("../a.cpp",), exports=("x",))
    s = spec.OpSpec(
        name="ok",
        root=tmp_path,
        cpu_sources=("a.cpp",),
        schemas=("ok(Tensor x) -> Tensor", "ok_backward(Tensor g) -> Tensor"),
    )
    assert s.exports == ("ok",)


# -------------------------------------------------------------------- key


def test_key_is_deterministic() -> None:
    assert key_of() == key_of()
    assert len(key_of()) == 64


def test_a_compiler_less_match_ignores_what_only_picks_the_toolchain() -> None:
    """``without_tools``: a node without the CUDA toolkit (no CUDA_HOME) matches an entry built where CUDA_HOME
    named it, as one without a C++ compiler matches one built with CXX set; the arch list, which changes the code,
    still counts."""
    built = {
        "compiler": {"path": "/usr/bin/g++"},
        "nvcc": {"path": "/usr/local/cuda/bin/nvcc"},
        "abi": 1,
        "env": {
            "CXX": "g++",
            "CUDA_HOME": "/usr/local/cuda",
            "CUDA_PATH": "/opt/cuda",
            "TORCH_CUDA_ARCH_LIST": "9.0",
        },
    }
    here = {"abi": 1, "env": {"TORCH_CUDA_ARCH_LIST": "9.0"}}
    assert jkey.without_tools(built) == jkey.without_tools(here) == here
    assert jkey.without_tools({**built, "env": {"TORCH_CUDA_ARCH_LIST": "8.0"}}) != here


PERTURBATIONS = {
    "source bytes": dict(digests={"softmax_cpu.cpp": "c" * 64, "register.cpp": "b" * 64}),
    "header added": dict(
        digests={"softmax_cpu.cpp": "a" * 64, "register.cpp": "b" * 64, "x.h": "d" * 64}
    ),
    "spec cflags": dict(spec_=dataclasses.replace(SOFTMAX, cflags=("-DFOO",))),
    "schemas": dict(spec_=dataclasses.replace(SOFTMAX, schemas=SOFTMAX.schemas[:1])),
    "jitops version": dict(system=dataclasses.replace(BASE_SYSTEM, jitops_version="9.9.9")),
    "torch version": dict(system=dataclasses.replace(BASE_SYSTEM, torch_version="2.13.1")),
    "torch git version": dict(system=dataclasses.replace(BASE_SYSTEM, torch_git_version="def")),
    "torch cuda": dict(system=dataclasses.replace(BASE_SYSTEM, torch_cuda="13.0")),
    "cxx11 abi": dict(system=dataclasses.replace(BASE_SYSTEM, cxx11_abi=False)),
    "python abi": dict(
        system=dataclasses.replace(BASE_SYSTEM, python_abi="cpython-312-x86_64-linux-gnu")
    ),
    "platform": dict(system=dataclasses.replace(BASE_SYSTEM, platform="darwin")),
    "machine": dict(system=dataclasses.replace(BASE_SYSTEM, machine="aarch64")),
    "compiler path": dict(cxx=dataclasses.replace(CXX, path="/opt/gcc/bin/g++")),
    "compiler version": dict(cxx=dataclasses.replace(CXX, version="g++ 13.1")),
    "cpu isa": dict(tgt=target.Target("cpu", "AVX2")),
    "cuda archs": dict(tgt=target.Target("cuda", "AVX512", ("8.0",)), nvcc=NVCC),
    "nvcc version": dict(
        tgt=target.Target("cuda", "AVX512", ("9.0",)),
        nvcc=dataclasses.replace(NVCC, version="release 13.1"),
    ),
}
CUDA_TARGET = target.Target("cuda", "AVX512", ("9.0",))
for _var in target.BUILD_ENV_VARS:
    # A CUDA-only variable is in CUDA keys only (test_env_var_reaches_exactly_the_keys_it_affects):
    # perturb one.
    _where = dict(tgt=CUDA_TARGET, nvcc=NVCC) if _var in target.CUDA_ENV_VARS else {}
    PERTURBATIONS[f"env {_var}"] = dict(
        system=dataclasses.replace(BASE_SYSTEM, build_env=((_var, "x"),)), **_where
    )


@pytest.mark.parametrize("what", sorted(PERTURBATIONS))
def test_each_ingredient_changes_the_key(what: str) -> None:
    kwargs = PERTURBATIONS[what]
    # same arch with the base nvcc
    if what == "nvcc version" or "tgt" in kwargs and what.startswith("env "):
        base = key_of(tgt=kwargs["tgt"], nvcc=NVCC)
    else:
        base = key_of()
    assert key_of(**kwargs) != base


# Which targets' keys each variable changes: host-compiler variables every key,
# CUDA-only variables (nvcc, the arch list, toolkit/cuDNN paths) CUDA keys only.
ENV_REACH = {
    "CXX": ["cpu", "cuda"],
    "CC": ["cpu", "cuda"],
    "CFLAGS": ["cpu", "cuda"],
    "CXXFLAGS": ["cpu", "cuda"],
    "LDFLAGS": ["cpu", "cuda"],
    "JITOPS_BUILDER": ["cpu", "cuda"],
    "TORCH_CUDA_ARCH_LIST": ["cuda"],
    "NVCC_PREPEND_FLAGS": ["cuda"],
    "NVCC_APPEND_FLAGS": ["cuda"],
    "CUDA_HOME": ["cuda"],
    "CUDA_PATH": ["cuda"],
    "CUDA_INC_PATH": ["cuda"],
    "CUDNN_HOME": ["cuda"],
    "CUDNN_PATH": ["cuda"],
}


def test_env_var_reaches_exactly_the_keys_it_affects() -> None:
    targets = {"cpu": (target.Target("cpu", "AVX512"), None), "cuda": (CUDA_TARGET, NVCC)}
    reach = {}
    for var in target.BUILD_ENV_VARS:
        system = dataclasses.replace(BASE_SYSTEM, build_env=((var, "x"),))
        reach[var] = [
            d
            for d, (tgt, nvcc) in targets.items()
            if key_of(system=system, tgt=tgt, nvcc=nvcc) != key_of(tgt=tgt, nvcc=nvcc)
        ]
    # JITOPS_BUILDER reaches the key through Settings.builder (the plan's builder), not the probed
    # environment.
    assert "JITOPS_BUILDER" not in target.BUILD_ENV_VARS
    reach["JITOPS_BUILDER"] = [
        d
        for d, (tgt, nvcc) in targets.items()
        if key_of(tgt=tgt, nvcc=nvcc, builder="fake") != key_of(tgt=tgt, nvcc=nvcc)
    ]
    assert reach == ENV_REACH


@pytest.mark.timeout(60)
def test_plan_keys_the_builder_from_settings_not_the_environment(tmp_path: Path) -> None:
    """The builder a plan keys (and builds with) is Settings.builder: a fake-builder setting changes
    the key even with no JITOPS_BUILDER in the process environment, and real builds key no builder."""
    from jitops.plan import make_plan
    from jitops.registry import lookup

    assert "JITOPS_BUILDER" not in os.environ  # conftest clears it
    plans = {
        b: make_plan(
            lookup("softmax"),
            "cpu",
            settings=Settings.from_env(
                {"JITOPS_CACHE_DIR": str(tmp_path), **({"JITOPS_BUILDER": b} if b else {})}
            ),
        )
        for b in ("", "real", "fake")
    }
    assert (
        plans["fake"].builder == "fake"
        and plans["fake"].ingredients["env"].get("JITOPS_BUILDER") == "fake"
    )
    assert plans["fake"].key != plans[""].key
    assert (
        plans["real"].key == plans[""].key and "JITOPS_BUILDER" not in plans[""].ingredients["env"]
    )


def test_cuda_arch_spellings_give_one_key() -> None:
    a = target.Target("cuda", "AVX512", parse_arch_list("9.0;8.0"))
    b = target.Target("cuda", "AVX512", parse_arch_list("8.0, 9.0"))
    assert a == b and key_of(tgt=a, nvcc=NVCC) == key_of(tgt=b, nvcc=NVCC)


@pytest.mark.parametrize("var", ["MAX_JOBS", "HOME", "TMPDIR", "VERBOSE", "JITOPS_PROGRESS", "PWD"])
def test_irrelevant_env_does_not_change_build_env(var: str) -> None:
    assert target.build_env({var: "/somewhere"}) == ()
    assert target.build_env({"CXXFLAGS": "-O1", var: "1"}) == (("CXXFLAGS", "-O1"),)


def test_source_digests_ignore_prefix_and_mtime(tmp_path: Path) -> None:
    a = shutil.copytree(SOFTMAX.root, tmp_path / "prefix_a" / "softmax")
    b = shutil.copytree(SOFTMAX.root, tmp_path / "other" / "deeper" / "softmax")
    os.utime(b / "softmax_cpu.cpp", (1, 1))
    da = jkey.source_state(dataclasses.replace(SOFTMAX, root=a))[0]
    db = jkey.source_state(dataclasses.replace(SOFTMAX, root=b))[0]
    assert da == db
    assert "<jitops>/jitops/op.h" in da and "softmax_common.h" in da
    (b / "softmax_common.h").write_text((b / "softmax_common.h").read_text() + "\n// edit\n")
    assert jkey.source_state(dataclasses.replace(SOFTMAX, root=b))[0] != da


def test_a_source_changed_after_its_digest_is_named(tmp_path: Path) -> None:
    """After a build: each way a source the key covers can change is named (edited, written again
    with the same bytes, added, removed); a source the spec names that is not there is refused."""
    root = Path(shutil.copytree(SOFTMAX.root, tmp_path / "softmax"))
    op = dataclasses.replace(SOFTMAX, root=root)
    digests, stamps = jkey.source_state(op)
    assert jkey.changed_source(op, digests, stamps) is None
    header = root / "softmax_common.h"
    text = header.read_text()
    header.write_text(text + "// edit\n")
    assert jkey.changed_source(op, digests, stamps) == "softmax_common.h was edited"
    header.write_text(text)
    os.utime(header, ns=(1, 1))
    assert jkey.changed_source(op, digests, stamps) == "softmax_common.h was written again"
    (root / "extra.h").write_text("// new\n")
    assert jkey.changed_source(op, digests, stamps) == "extra.h was added"
    (root / "extra.h").unlink()
    header.unlink()
    assert jkey.changed_source(op, digests, stamps) == "softmax_common.h was removed"
    stamped = {label for label, _, _ in jkey.source_stamp(op)}
    assert stamped and header.name not in stamped and stamped < set(digests)
    source = root / op.cpu_sources[0]
    source.unlink()
    with pytest.raises(FileNotFoundError, match="not found under"):
        jkey.source_state(op)


def test_flags_with_a_line_break_inside_quotes_are_refused() -> None:
    assert jkey.split_flags("CXXFLAGS", "-O2 -DNAME='\"x\"'") == ("-O2", '-DNAME="x"')
    with pytest.raises(JitopsError, match="line break inside quotes"):
        jkey.split_flags("CXXFLAGS", "-DNAME='a\nb'")


@pytest.mark.process
@pytest.mark.timeout(120)
def test_key_is_stable_across_processes_cwds_and_homes(tmp_path: Path) -> None:
    keys = set()
    for i, extra in enumerate(
        [{}, {"HOME": str(tmp_path), "TMPDIR": str(tmp_path), "MAX_JOBS": "7"}]
    ):
        env = child_env(PYTHONHASHSEED=str(i + 1), **extra)
        keys.add(run_scenario("scenarios_inert.plan_key", env=env))
    assert len(keys) == 1


# ----------------------------------------------------------------- target


def test_target_defaults_to_cpu_without_gpu() -> None:
    t = target.choose_target(BASE_SYSTEM)
    assert t == target.Target("cpu", "AVX512") and t.name == "cpu-avx512"
    assert "-DCPU_CAPABILITY_AVX512" in t.cflags() and "-O3" in t.cflags()


def test_openmp_torch_builds_with_openmp_so_parallel_for_runs_parallel() -> None:
    omp = dataclasses.replace(BASE_SYSTEM, openmp=True)
    for device in ("cpu", "cuda"):
        system = dataclasses.replace(omp, torch_cuda="13.0") if device == "cuda" else omp
        t = target.choose_target(system, device, "9.0" if device == "cuda" else None)
        assert "-fopenmp" in t.cflags() and t.ldflags() == ("-fopenmp",)
    plain = target.choose_target(BASE_SYSTEM)
    assert plain.ldflags() == () and "-fopenmp" not in plain.cflags()
    assert key_of(system=omp) != key_of()
    import torch

    assert target.probe().openmp == torch.backends.openmp.is_available()


def test_cuda_target_needs_cuda_torch_and_archs() -> None:
    with pytest.raises(TargetError, match="CPU-only build"):
        target.choose_target(BASE_SYSTEM, "cuda")
    cuda_sys = dataclasses.replace(BASE_SYSTEM, torch_cuda="13.0")
    with pytest.raises(TargetError, match="jitops warm --device cuda --arch"):
        target.choose_target(cuda_sys, "cuda")
    gpu = dataclasses.replace(cuda_sys, cuda_available=True, device_capability=(9, 0))
    assert target.choose_target(gpu).name == "cuda-sm90"
    t = target.choose_target(cuda_sys, "cuda", "8.0,9.0+PTX")
    assert t.name == "cuda-sm80-sm90ptx"
    assert "-gencode=arch=compute_90,code=compute_90" in t.cuda_cflags()


# ------------------------------------------------------------ inert import


@pytest.mark.process
@pytest.mark.timeout(60)
def test_import_is_inert() -> None:
    report = run_scenario("scenarios_inert.import_is_inert")
    assert report == {
        "events": [],
        "torch": False,
        "cpp_extension": False,
        "loader": False,
        "platformdirs": False,
    }


def test_cache_root_is_resolved_at_call_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "a"))
    assert Settings.from_env().cache_root() == tmp_path / "a"
    monkeypatch.delenv("JITOPS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Settings.from_env().cache_root() == tmp_path / "xdg" / "jitops"


def test_manifest_round_trip_and_rejects_garbage() -> None:
    m = jmanifest.Manifest(
        key="k" * 64,
        library="softmax",
        target="cpu-avx512",
        namespace="jitops_softmax_x",
        library_file="libsoftmax.so",
        sha256="0" * 64,
        size=1,
        build_seconds=1.0,
        built_at=0.0,
        ingredients={"a": 1},
        build_log="",
    )
    assert jmanifest.Manifest.parse(m.to_json()) == m
    bad = json.loads(m.to_json())
    bad["library_file"] = "../../evil.so"
    for raw in (b"", b"{", b"[]", json.dumps(bad).encode(), b'{"format": 2}'):
        with pytest.raises((ValueError, TypeError)):
            jmanifest.Manifest.parse(raw)
    # forged fields: each refused with what is wrong, never loaded as a manifest
    good = json.loads(m.to_json())
    digest = "a" * 64
    forged = {
        "unknown fields": {**good, "run_this": "rm -rf /"},
        "wrong type": {**good, "size": "1"},
        "inputs not a mapping": {**good, "inputs": ["x.h"]},
        "inputs with an empty label": {**good, "inputs": {"": digest}},
        "inputs with a short digest": {**good, "inputs": {"x.h": "a" * 63}},
        "inputs with a NUL in a label": {**good, "inputs": {"x\0.h": digest}},
        "inputs with a digest not hex": {**good, "inputs": {"x.h": "g" * 64}},
        "inputs with upper-case hex": {**good, "inputs": {"x.h": "A" * 64}},
    }
    for body in forged.values():
        with pytest.raises(ValueError, match="unknown fields|wrong type|wrong shape"):
            jmanifest.Manifest.parse(json.dumps(body).encode())
    for inputs in ({"x.h": digest}, {}):  # well-formed inputs, sealed by the digest
        sealed = dataclasses.replace(m, inputs=inputs)
        assert jmanifest.Manifest.parse(sealed.to_json()).inputs == inputs


# ------------------------------------------------------------------ functionalization pairings


def _pairs(*schemas: str) -> list[tuple[str, str, str]]:
    import torch

    from jitops.loading.functionalize import pairings

    return [
        (p.mutable, p.functional, p.written)
        for p in pairings(torch._C.parse_schema(s) for s in schemas)
    ]


def test_in_place_and_out_ops_pair_with_their_functional_twin() -> None:
    add = "add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
    out = "add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)"
    inplace = "add_(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)"
    assert sorted(_pairs(add, out, inplace)) == [("add.out", "add", "out"), ("add_", "add", "self")]


@pytest.mark.parametrize(
    "schemas",
    [
        # no functional twin
        ["add_(Tensor(a!) self, Tensor other) -> Tensor(a!)"],
        # twin's arguments differ
        [
            "add(Tensor self, Tensor other) -> Tensor",
            "add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
        ],
        # returns nothing: torch auto-functionalizes those itself
        ["scale(Tensor self) -> Tensor", "scale_(Tensor(a!) self) -> ()"],
        # two written tensors
        [
            "f(Tensor a, Tensor b) -> Tensor",
            "f.out(Tensor a, Tensor b, *, Tensor(a!) out, Tensor(b!) other) -> Tensor(a!)",
        ],
        # the written tensor is not the first argument of an in-place op
        ["g(Tensor a, Tensor b) -> Tensor", "g_(Tensor a, Tensor(a!) b) -> Tensor(a!)"],
        # the return is not the written tensor
        ["h(Tensor a) -> Tensor", "h_(Tensor(a!) a) -> Tensor"],
    ],
)
def test_ops_that_do_not_follow_the_native_convention_are_left_alone(schemas: list[str]) -> None:
    assert _pairs(*schemas) == []


# ------------------------------------------------------------------ settings and the house


def test_settings_parse_once_and_name_the_variable_on_bad_values() -> None:
    s = Settings.from_env(
        {
            "JITOPS_CACHE_DIR": "/tmp/x",
            "JITOPS_OFFLINE": "1",
            "JITOPS_LOCK_TIMEOUT": "2.5",
            "JITOPS_PROGRESS": "0",
            "MAX_JOBS": "3",
            "JITOPS_BUILDER": "fake",
        }
    )
    assert (s.cache_root(), s.offline, s.lock_timeout, s.progress, s.jobs, s.builder) == (
        Path("/tmp/x"),
        True,
        2.5,
        False,
        3,
        "fake",
    )
    assert Settings.from_env({}) == Settings()
    for var, value in (
        ("JITOPS_LOCK_TIMEOUT", "abc"),
        ("JITOPS_OFFLINE", "maybe"),
        ("JITOPS_BUILDER", "magic"),
        ("JITOPS_PROGRESS", "loud"),
        ("JITOPS_FAKE_BUILD_SECONDS", "x"),
    ):
        with pytest.raises(jitops.ConfigError) as e:
            Settings.from_env({var: value})
        assert isinstance(e.value, ValueError)
        assert f"{var}={value!r}" in str(e.value) and "Fix:" in str(e.value)


def test_the_loader_is_imported_by_no_stage_below_it() -> None:
    from import_graph import graph

    g = graph()
    assert "jitops.loading.loader" not in set().union(
        *(
            g[m]
            for m in (
                "jitops.loading.ops",
                "jitops.build.publish",
                "jitops.plan",
                "jitops.registry",
                "jitops.store.roots",
            )
        )
    )


def test_the_remote_package_sits_on_top_and_is_imported_only_lazily() -> None:
    """jitops.remote never imports back up into the pipeline (loader, entry, cli, diagnose, ...), and no
    module of jitops imports it at its top level: without JITOPS_REMOTE_CACHE it is never imported."""
    import ast

    pkg = Path(jitops.__file__).parent
    from import_graph import graph

    above = ("jitops.loading", "jitops.build", "jitops.api", "jitops.cli", "jitops.bench")
    upward = [
        f"{m} -> {d}"
        for m, deps in graph().items()
        if m.startswith("jitops.remote")
        for d in deps
        if d.startswith(above)
    ]
    eager = []
    for path in sorted(pkg.rglob("*.py")):
        if "remote" in path.relative_to(pkg).parts:
            continue
        for node in ast.parse(
            path.read_text()
        ).body:  # module level only; lazy imports sit in functions
            if isinstance(node, ast.ImportFrom) and "remote" in (node.module or "").split("."):
                eager.append(path.name)
    assert upward == [] and eager == []


def test_settings_read_the_remote_variables() -> None:
    assert Settings.from_env({}).remote is None
    s = Settings.from_env(
        {
            "JITOPS_REMOTE_CACHE": "file:///shared",
            "JITOPS_CONFIG_DIR": "/cfg",
            "JITOPS_REMOTE_LEASE_SECONDS": "5",
        }
    )
    assert s.remote is not None and (s.remote.url, s.remote.mode, s.remote.lease_seconds) == (
        "file:///shared",
        "auto",
        5.0,
    )
    assert s.config_dir == s.remote.config_dir == "/cfg"
    with pytest.raises(jitops.ConfigError, match="JITOPS_REMOTE_LEASE_SECONDS='0'.*Fix:"):
        Settings.from_env(
            {"JITOPS_REMOTE_CACHE": "file:///shared", "JITOPS_REMOTE_LEASE_SECONDS": "0"}
        )


def test_only_settings_reads_jitops_variables_and_nothing_writes_the_environment() -> None:
    import ast

    pkg = Path(jitops.__file__).parent
    readers, writers = [], []
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                text = ast.unparse(node)
                if (
                    ("environ" in text or "getenv" in text)
                    and "'JITOPS_" in text
                    and path.name != "settings.py"
                ):
                    readers.append(f"{path.name}:{node.lineno}")
                if text.startswith(
                    ("os.environ.pop", "os.environ.update", "os.environ.setdefault", "os.putenv")
                ):
                    writers.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
                if "'JITOPS_" in ast.unparse(node.slice) and path.name != "settings.py":
                    readers.append(f"{path.name}:{node.lineno}")
                if isinstance(node.ctx, (ast.Store, ast.Del)):
                    writers.append(f"{path.name}:{node.lineno}")
    assert readers == [] and writers == []


def test_child_programs_are_scenario_functions_not_code_strings() -> None:
    """No test hands Python a program as a string (``python -c``): children run functions of
    tests/scenarios*.py through helpers.run_scenario, which linters and tracebacks can see."""
    import ast

    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)):
                items = [ast.unparse(e) for e in node.elts]
                for before, item in zip(items, items[1:]):
                    if item == "'-c'" and ("executable" in before or "python" in before):
                        offenders.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, (ast.FunctionDef, ast.Call)) and "run_py" in (
                node.name if isinstance(node, ast.FunctionDef) else ast.unparse(node.func)
            ):
                offenders.append(f"{path.name}:{node.lineno} run_py")
    assert offenders == []


def test_register_returns_a_handle_that_undoes_it(tmp_path: Path) -> None:
    from jitops.registry import registry

    (tmp_path / "k.cpp").write_text("// k\n")
    spec = jitops.OpSpec(
        name="undo_me", root=tmp_path, cpu_sources=("k.cpp",), exports=("undo_me_op",)
    )
    handle = jitops.register(spec)
    assert registry().find("undo_me_op") is spec
    handle.undo()
    assert registry().find("undo_me_op") is None and "undo_me_op" not in jitops.list_ops()
    with jitops.register(spec):
        replaced = jitops.OpSpec(
            name="undo_me", root=tmp_path, cpu_sources=("k.cpp",), exports=("undo_me_two",)
        )
        with jitops.register(replaced, replace=True):
            assert (
                registry().find("undo_me_two") is replaced and registry().find("undo_me_op") is None
            )
        assert registry().find("undo_me_op") is spec and registry().find("undo_me_two") is None
    assert registry().find("undo_me_op") is None


def test_the_probes_cheap_answers_equal_the_standard_librarys() -> None:
    """The warm path's shortcuts (issue 32 item 4) give the key the same ingredients: SOABI from the extension
    suffix, not sysconfig; flag strings split without shlex where they hold no quote, escape or odd whitespace."""
    import random
    import shlex
    import sysconfig

    from jitops.spec.checks import shell_words

    assert target._python_abi() == sysconfig.get_config_var("SOABI")
    rnd = random.Random(32)
    alphabet = " \t\r\n-=_#;$a1é\x0b\x1f'\"\\"
    for text in [
        "",
        "-O2 -Wall",
        '-DNAME="a b"',
        *("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 10))) for _ in range(3000)),
    ]:
        try:
            expected: list[str] | None = shlex.split(text)
        except ValueError:
            expected = None
        try:
            got: list[str] | None = shell_words(text)
        except ValueError:
            got = None
        assert got == expected, repr(text)
