"""User kernels on torch's stable C ABI (jitops.build.stable): dispatcher ops, keyed to survive torch upgrades.

Real compiler: the scale kernel is built once per session (module fixture), its edit once; the error
cases fail before compiling or within the first header. Pure tests check the key's ingredients.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import jitops
from jitops.build import pch, pch_bg, stable, stable_fast
from jitops.store.cache import Cache
from jitops.errors import ArgumentError, ConfigError, KernelSourceError, TargetError
from jitops.key import STABLE_ABI_FLAG, build_flags, compute_key, ingredients
from jitops.spec import OpSpec
from jitops.target import Target, probe

from tests.helpers import child_env, run_scenario

SCALE = r"""#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>

using torch::stable::Tensor;

Tensor scale(Tensor x, double s) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float, "scale: x must be float32");
  STD_TORCH_CHECK(x.is_contiguous(), "scale: x must be contiguous");
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = FACTOR;
  return out;
}

STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) { m.impl("scale", TORCH_BOX(&scale)); }
"""
FIRST = SCALE.replace("FACTOR", "xp[i] * static_cast<float>(s)")
EDITED = SCALE.replace("FACTOR", "xp[i] * static_cast<float>(s) + 1.0f")


def _with_fake(lib: jitops.UserLibrary) -> jitops.UserLibrary:
    ns = lib.library.namespace
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::scale", "Meta"):
        torch.library.register_fake(f"{ns}::scale")(lambda x, s: torch.empty_like(x))
    return lib


@pytest.fixture(scope="module")
def built(session_cache: Path) -> jitops.UserLibrary:
    return _with_fake(jitops.load_inline("stable_scale", FIRST))


@pytest.mark.compile
def test_load_inline_is_a_dispatcher_op_with_the_right_result(built: jitops.UserLibrary) -> None:
    x = torch.randn(1000)
    torch.testing.assert_close(built.scale(x, 2.5), x * 2.5)
    op = getattr(torch.ops, built.library.namespace).scale
    torch.testing.assert_close(op(x, -1.0), -x)
    assert built.library.manifest.ingredients["abi"] == "stable"
    # a C++ error crosses the C ABI intact
    with pytest.raises(RuntimeError, match="scale: x must be float32"):
        built.scale(x.double(), 1.0)


@pytest.mark.compile
def test_opcheck_and_torch_compile_fullgraph(built: jitops.UserLibrary) -> None:
    op = getattr(torch.ops, built.library.namespace).scale.default
    torch.library.opcheck(op, (torch.randn(7), 3.0))
    torch.library.opcheck(op, (torch.randn(0), 3.0))

    @torch.compile(fullgraph=True, backend="inductor")
    def f(x: torch.Tensor) -> torch.Tensor:
        return op(x.sin(), 2.0) + 1

    x = torch.randn(64)
    torch.testing.assert_close(f(x), x.sin() * 2 + 1)


@pytest.mark.compile
def test_rerun_is_a_hit_and_an_edit_rebuilds(built: jitops.UserLibrary) -> None:
    # same source: the same object, nothing built
    assert jitops.load_inline("stable_scale", FIRST) is built
    # the stable headers' PCH, started after the first build (a user edits meanwhile)
    assert pch_bg.wait(300)
    edited = jitops.load_inline("stable_scale", EDITED)
    assert edited.library.built and edited.library.key != built.library.key
    # the edit compiles with it
    assert edited.library.manifest.timings["files"]["stable_scale.cpp"]["pch"] == "hit"
    x = torch.randn(16)
    torch.testing.assert_close(edited.scale(x, 2.0), x * 2 + 1)
    torch.testing.assert_close(built.scale(x, 2.0), x * 2)  # the old handle keeps its code


@pytest.mark.compile
def test_library_imports_only_the_stable_c_shim(built: jitops.UserLibrary) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run(
        [nm, "-D", "--undefined-only", str(built.library.library_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    torch_cxx = [
        n
        for n in names
        if re.match(r"_ZN\d*(c10|at|torch|caffe2)\b|_ZN(K)?(3c10|2at|5torch|6caffe2)", n)
    ]
    assert not torch_cxx, f"C++ symbols of torch imported: {torch_cxx[:5]}"
    unversioned = [
        n for n in names if "@" not in n and not n.startswith(("_ITM_", "__gmon_start__"))
    ]
    assert unversioned and all(n.startswith(("aoti_torch_", "torch_")) for n in unversioned), (
        unversioned
    )


@pytest.mark.compile
@pytest.mark.process
def test_a_new_process_loads_it_without_building(
    built: jitops.UserLibrary, session_cache: Path
) -> None:
    reply = run_scenario(
        "scenarios_stable.load_stable",
        env=child_env(JITOPS_CACHE_DIR=str(session_cache)),
        timeout=120,
        name="stable_scale",
        source=FIRST,
    )
    assert reply == {**reply, "built": False, "out": [4.0, 4.0, 4.0], "unused_imported": []}, reply


def test_a_stray_aten_include_names_the_line_and_the_fix() -> None:
    src = FIRST.replace(
        "#include <torch/csrc/stable/ops.h>",
        "#include <torch/csrc/stable/ops.h>\n#include <ATen/ATen.h>",
    )
    with pytest.raises(
        KernelSourceError, match=r"stable_bad\.cpp:4 includes <ATen/ATen\.h>.*Fix: include only"
    ):
        jitops.load_inline("stable_bad", src)
    with pytest.raises(KernelSourceError, match=r"<torch/extension\.h>"):
        jitops.load_inline("stable_bad", "#include <torch/extension.h>\n" + FIRST, abi="stable")


def test_no_op_or_an_unknown_abi_is_refused_before_compiling() -> None:
    with pytest.raises(KernelSourceError, match="defines no op"):
        jitops.load_inline("stable_bad", "int f() { return 1; }", abi="stable")
    with pytest.raises(ArgumentError, match="abi='stable'"):
        jitops.load_inline("stable_bad", FIRST, abi="unstable")


@pytest.mark.compile
def test_a_header_reaching_aten_is_translated_from_torchs_error(tmp_path: Path) -> None:
    (tmp_path / "mine.h").write_text("#pragma once\n#include <torch/library.h>\n")
    (tmp_path / "k.cpp").write_text('#include "mine.h"\n' + FIRST)
    with pytest.raises(
        KernelSourceError, match=r"header of torch's C\+\+ API is included \(through .*k\.cpp:1\)"
    ):
        jitops.load("stable_hdr", [str(tmp_path / "k.cpp")])


def test_target_version_encoding_and_the_running_torch_check() -> None:
    assert stable.version_flag((2, 10)) == "-DTORCH_TARGET_VERSION=0x020a000000000000"
    assert stable.target_of([], "2.15.1") == ("-DTORCH_TARGET_VERSION=0x020d000000000000", (2, 13))
    assert stable.target_of(["-DTORCH_TARGET_VERSION=0x020b000000000000"], "2.13.0")[1] == (2, 11)
    with pytest.raises(ArgumentError, match="major << 56"):
        stable.target_of(["-DTORCH_TARGET_VERSION=2.13"], "2.13.0")
    # the compiler would build for a target the key and the check miss
    # two words, as torch's loader passes them to the compiler: the same macro
    assert stable.target_of(["-D", "TORCH_TARGET_VERSION=0x020e000000000000"], "2.13.0") == (
        "-DTORCH_TARGET_VERSION=0x020e000000000000",
        (2, 14),
    )
    assert stable.target_of(["-D", "TORCH_STABLE_ONLY"], "2.13.0")[1] == (2, 13)
    for words in (
        ["-U", "TORCH_STABLE_ONLY"],
        [
            "-D",
            "TORCH_TARGET_VERSION=0x020e000000000000",
            "-DTORCH_TARGET_VERSION=0x020d000000000000",
        ],
        ["-UTORCH_TARGET_VERSION"],
        ["-DTORCH_TARGET_VERSION=0x020d000000000000", "-DTORCH_TARGET_VERSION=0x020e000000000000"],
        ["-UTORCH_STABLE_ONLY"],
    ):
        with pytest.raises(ArgumentError, match="one -DTORCH_TARGET_VERSION=<number> word"):
            stable.target_of(words, "2.13.0")
    # -DTORCH_STABLE_ONLY, as torch's own stable extensions pass it, beside a target or alone
    only = "-DTORCH_STABLE_ONLY"
    assert stable.target_of([only, "-DTORCH_TARGET_VERSION=0x020b000000000000"], "2.13.0") == (
        "-DTORCH_TARGET_VERSION=0x020b000000000000",
        (2, 11),
    )
    assert stable.target_of([only, f"{only}=1"], "2.13.0")[1] == (2, 13)
    with pytest.raises(ArgumentError, match="one -DTORCH_TARGET_VERSION=<number> word"):
        stable.target_of(
            [
                only,
                "-DTORCH_TARGET_VERSION=0x020b000000000000",
                "-DTORCH_TARGET_VERSION=0x020c000000000000",
            ],
            "2.13.0",
        )
    job = types.SimpleNamespace(
        library="k",
        namespace="ns",
        include_dirs=(),
        cflags=(STABLE_ABI_FLAG, "-DTORCH_TARGET_VERSION=0x020b000000000000", only),
    )
    assert only in stable.compile_words(job)
    with pytest.raises(ConfigError, match="TORCH_TARGET_VERSION"):
        stable.compile_words(
            types.SimpleNamespace(**{**vars(job), "cflags": (*job.cflags, "-UTORCH_STABLE_ONLY")})
        )
    stable.check_torch("k", (2, 13), "2.13.0+cpu")
    stable.check_torch("k", (2, 13), "2.15.0")
    with pytest.raises(
        TargetError, match=r"targets torch's stable ABI 2\.14.*runs torch 2\.13\.0.*upgrade torch"
    ):
        stable.check_torch("k", (2, 14), "2.13.0")


def test_key_holds_the_target_version_not_torchs() -> None:
    system = probe()
    spec = OpSpec(
        name="k",
        root=Path("/nonexistent"),
        cpu_sources=("k.cpp",),
        cflags=(STABLE_ABI_FLAG, stable.version_flag((2, 13))),
    )
    target = Target("cpu", "AVX2", openmp=True)
    digests = {"k.cpp": "0" * 64}

    def key(sys_: object = system, spec_: OpSpec = spec, target_: Target = target) -> str:
        return compute_key(ingredients(spec_, target_, sys_, None, None, digests))  # type: ignore[arg-type]

    ingr = ingredients(spec, target, system, None, None, digests)
    assert (
        ingr["torch_version"] is None
        and ingr["torch_git_version"] is None
        and ingr["python_abi"] is None
    )
    assert system.torch_version not in repr(ingr)
    for field, value in (
        ("torch_version", "2.99.0"),
        ("torch_git_version", "deadbeef"),
        ("python_abi", "cpython-399"),
    ):
        # a torch upgrade keeps the key
        assert key(dataclasses.replace(system, **{field: value})) == key()
    assert (
        key(spec_=dataclasses.replace(spec, cflags=(STABLE_ABI_FLAG, stable.version_flag((2, 14)))))
        != key()
    )
    assert key(target_=Target("cpu", "AVX512", openmp=True)) != key()  # the ISA stays in it
    cflags, _, ldflags = build_flags(
        dataclasses.replace(spec, origin="jitops.load_inline (stable ABI)"), target, system
    )
    # a user's kernel
    assert "-fopenmp" not in cflags + ldflags and "-O2" in cflags and "-mavx2" not in cflags
    # a builtin stable library (nms) gets the target's -O3 and ISA flags instead, each flag once
    builtin, _, _ = build_flags(spec, target, system)
    assert (
        "-O2" not in builtin
        and builtin.count("-O3") == 1
        and "-mavx2" in builtin
        and len(set(builtin)) == len(builtin)
    )
    assert "-fopenmp" not in builtin and "-std=c++17" in builtin
    full = dataclasses.replace(spec, cflags=())  # a C++-API library keeps torch's exact version
    assert (
        ingredients(full, target, system, None, None, digests)["torch_version"]
        == system.torch_version
    )


def test_detection() -> None:
    assert stable.is_stable([FIRST]) and not stable.is_stable(["JITOPS_LIBRARY(m) {}"])
    assert (
        stable.wanted("f", None, [FIRST])
        and stable.wanted("f", "stable", ["x"])
        and not stable.wanted("f", None, ["x"])
    )


def test_fixed_namespaces_are_read_with_the_flags_macros() -> None:
    src = "STABLE_TORCH_LIBRARY(JITOPS_NS, m) {}\nSTABLE_TORCH_LIBRARY_FRAGMENT(LIB_NS, m) {}\n"
    assert stable.fixed_namespaces([src], ["-O2 -DLIB_NS=peer_ns"]) == ["peer_ns"]
    assert stable.fixed_namespaces([src, "STABLE_TORCH_LIBRARY(b, m) {}"], []) == ["LIB_NS", "b"]
    # an IMPL alone defines no op there
    assert stable.fixed_namespaces(["STABLE_TORCH_LIBRARY_IMPL(aten, CPU, m) {}"], []) == []


# Written as for torch's loader: a fixed namespace, a FRAGMENT, two CPU IMPL blocks, an op only a
# build with FIXED_EXTRA compiles; its flags are torch's stable extensions' own.
FIXED = r"""#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
using torch::stable::Tensor;
Tensor twice(Tensor x) {
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = xp[i] * TWICE;
  return out;
}
Tensor same(Tensor x) { return torch::stable::clone(x); }
STABLE_TORCH_LIBRARY(jitops_fixed_t, m) { m.def("twice(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_FRAGMENT(jitops_fixed_t, m) { m.def("same(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(jitops_fixed_t, CPU, m) { m.impl("twice", TORCH_BOX(&twice)); }
STABLE_TORCH_LIBRARY_IMPL(jitops_fixed_t, CPU, m) { m.impl("same", TORCH_BOX(&same)); }
#ifdef FIXED_EXTRA
STABLE_TORCH_LIBRARY_FRAGMENT(jitops_fixed_t, m) { m.def("extra(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(jitops_fixed_t, CPU, m) { m.impl("extra", TORCH_BOX(&same)); }
#endif
"""
TORCH_FLAGS = ["-DTORCH_STABLE_ONLY", "-DTORCH_TARGET_VERSION=0x020a000000000000"]


@pytest.mark.compile
def test_a_fixed_namespace_builds_unchanged_and_an_edit_in_the_same_process_names_the_limit(
    session_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's flags and a fixed namespace load as torch's loader loads them; the ops are those the library
    registered (not the #ifdef'd one); the same build again is the loaded library; an edit is refused before it
    is built, naming the namespace, the restart and JITOPS_NS, and the loaded code stays."""
    # other flags, another prefix: no second stable PCH beside the one the PCH test counts
    monkeypatch.setenv("JITOPS_PCH_BACKGROUND", "0")
    lib = jitops.load_inline(
        "stable_fixed", FIXED.replace("TWICE", "2.0f"), extra_cflags=TORCH_FLAGS
    )
    assert sorted(lib.ops) == ["same", "twice"]
    x = torch.randn(5)
    torch.testing.assert_close(torch.ops.jitops_fixed_t.twice(x), x * 2)
    torch.testing.assert_close(lib.twice(x), x * 2)
    torch.testing.assert_close(lib.same(x), x)
    assert lib.twice.qualname == "jitops_fixed_t::twice"
    again = jitops.load_inline(
        "stable_fixed", FIXED.replace("TWICE", "2.0f"), extra_cflags=TORCH_FLAGS
    )
    assert again is lib
    # as torch's load with is_python_module=False: the loaded library's path
    path = jitops.load_inline(
        "stable_fixed",
        FIXED.replace("TWICE", "2.0f"),
        extra_cflags=TORCH_FLAGS,
        is_python_module=False,
    )
    assert path == str(lib.library.library_path)
    entries = sorted(p.name for p in session_cache.rglob("manifest.json"))
    with pytest.raises(KernelSourceError) as info:
        jitops.load_inline("stable_fixed", FIXED.replace("TWICE", "3.0f"), extra_cflags=TORCH_FLAGS)
    message = str(info.value)
    assert "namespace 'jitops_fixed_t'" in message and "from a different build" in message
    assert "restart" in message and "STABLE_TORCH_LIBRARY(JITOPS_NS, m)" in message
    assert sorted(p.name for p in session_cache.rglob("manifest.json")) == entries  # nothing built
    torch.testing.assert_close(torch.ops.jitops_fixed_t.twice(x), x * 2)


@pytest.mark.compile
def test_an_op_under_an_ifdef_the_build_left_out_is_not_exported() -> None:
    """The op names come from what the library registered: a def the preprocessor dropped is none of them
    (read from the source text, it was, and loading failed with a raw AttributeError)."""
    src = FIRST + (
        "#ifdef NOT_DEFINED_HERE\n"
        'STABLE_TORCH_LIBRARY_FRAGMENT(JITOPS_NS, m) { m.def("gone(Tensor x) -> Tensor"); }\n'
        "#endif\n"
    )
    lib = jitops.load_inline("stable_ifdef", src)
    assert list(lib.ops) == ["scale"]
    torch.testing.assert_close(lib.scale(torch.ones(2), 3.0), torch.full((2,), 3.0))


@pytest.mark.compile
def test_torchs_flags_as_two_words_each_build_for_their_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``-D NAME`` reaches the compiler as ``-DNAME`` does, as torch's loader passes it: accepted,
    and the target it names is the entry's."""
    # other flags: no second stable PCH beside the one the PCH test counts
    monkeypatch.setenv("JITOPS_PCH_BACKGROUND", "0")
    flags = ["-D", "TORCH_STABLE_ONLY", "-D", "TORCH_TARGET_VERSION=0x020a000000000000"]
    lib = jitops.load_inline("stable_two_words", FIRST, extra_cflags=flags)
    torch.testing.assert_close(lib.scale(torch.ones(2), 3.0), torch.full((2,), 3.0))
    ingredients = json.dumps(lib.library.manifest.ingredients)
    assert "-DTORCH_TARGET_VERSION=0x020a000000000000" in ingredients, ingredients


@pytest.mark.compile
@pytest.mark.process
@pytest.mark.timeout(600)
def test_example_notebook_runs_green(monkeypatch: pytest.MonkeyPatch, session_cache: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    repo = Path(__file__).parents[1]
    monkeypatch.setenv("PYTHONPATH", str(repo))
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("JITOPS_PROGRESS", raising=False)
    nb = nbformat.read(repo / "examples" / "stable_abi.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(repo / "examples")}},
    ).execute()
    out = "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )
    for line in (
        "scale matches PyTorch: True",
        "edited kernel adds 1: True",
        "old handle still works: True",
        "same source, same object: True",
        "torch.compile(fullgraph=True): True",
        "RuntimeError: scale: x must be float32",
        "includes <ATen/ATen.h>",
    ):
        assert line in out, out


def test_a_target_hidden_in_a_flag_string_or_cxxflags_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One extra_cflags string holding two flags is read as the compiler's words: its target is the library's
    (a newer one than this torch is refused before compiling); a target in CXXFLAGS is refused by the builder."""
    newer = stable.version_flag((2, 99))
    with pytest.raises(TargetError, match=r"targets torch's stable ABI 2\.99"):
        jitops.load_inline("stable_hidden", FIRST, extra_cflags=[f"-O2 {newer}"])
    monkeypatch.setenv("CXXFLAGS", "-UTORCH_TARGET_VERSION")
    with pytest.raises(ConfigError, match="CXXFLAGS"):
        jitops.load_inline("stable_cxxflags", SCALE.replace("FACTOR", "3.0f"))


def test_arguments_the_stable_path_cannot_honour_are_refused(tmp_path: Path) -> None:
    """schemas= with stable sources, and a CUDA flag naming another ABI target: a named error, never
    a build that silently ignored them (load and load_inline alike); device='cuda' under a CPU
    torch: the target's error (CUDA kernels on the stable ABI: tests/test_stable_cuda.py)."""
    src = tmp_path / "k.cpp"
    src.write_text(FIRST)
    if torch.version.cuda is None:
        with pytest.raises(TargetError, match="CPU-only build"):
            jitops.load("stable_cuda_dev", [str(src)], device="cuda")
    other = {"extra_cuda_cflags": [stable.version_flag((2, 12))]}
    for kw, match in (
        ({"schemas": ["scale(Tensor x, float s) -> Tensor"]}, "takes no schemas="),
        (other, "extra_cuda_cflags holds"),
    ):
        with pytest.raises(ArgumentError, match=match):
            jitops.load("stable_args", [str(src)], **kw)  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match=match):
            jitops.load_inline("stable_args", FIRST, **kw)  # type: ignore[arg-type]


@pytest.mark.compile
def test_the_stable_pch_is_made_off_the_wait_shared_and_verified(
    built: jitops.UserLibrary, session_cache: Path, tmp_path: Path
) -> None:
    """The first stable build (an empty cache: the module fixture's, unless another stable kernel with the same
    prefix made the PCH first) compiled without the PCH and started it detached: published after the build's
    compile ended. Another library of the same prefix and flags uses it on its first build; a damaged copy is
    set aside, never used. Its link named the shim's library through the stub."""
    first = built.library.manifest.timings
    assert (
        first["files"]["stable_scale.cpp"]["pch"] in ("background", "hit")
        and first["link"] == "stub"
    )
    assert pch_bg.wait(300)
    store = Cache(session_cache)
    made = [
        d
        for d in store.pch.iterdir()
        if (d / "manifest.json").is_file()
        and "torch/csrc/stable/library.h" in (d / pch.HEADER).read_text()
    ]
    assert len(made) == 1, made
    if first["files"]["stable_scale.cpp"]["pch"] == "background":  # never on the user's wait
        assert (made[0] / "manifest.json").stat().st_mtime > first["at"]
    other = jitops.load_inline("stable_other", FIRST.replace("* static_cast<float>(s)", "* 2.0f"))
    assert other.library.manifest.timings["files"]["stable_other.cpp"]["pch"] == "hit"
    torch.testing.assert_close(other.scale(torch.ones(3), 5.0), torch.full((3,), 2.0))
    key = json.loads((made[0] / "manifest.json").read_text())["key"]
    copy = Cache(tmp_path / "c")
    shutil.copytree(made[0], copy.build_path("pch", key))
    assert pch.find(copy, key, "gcc") is not None  # the intact copy verifies
    gch = copy.build_path("pch", key) / "prefix.h.gch"
    with open(gch, "r+b") as f:  # same size, one byte flipped in the middle
        f.seek(os.path.getsize(gch) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    # set aside
    assert pch.find(copy, key, "gcc") is None and not copy.build_path("pch", key).exists()


def _job(
    root: str,
    cflags: tuple[str, ...] = ("-O2",),
    cache: Cache | None = None,
    ldflags: tuple[str, ...] = (),
) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        include_dirs=(Path("/inc"), Path(root)),
        root=Path(root),
        pinned=(),
        cflags=cflags,
        cache=cache,
        cxx="c++",
        identity="{}",
        env=dict(os.environ),
        build_dir=Path(root),
        ldflags=ldflags,
    )


def test_the_stable_pch_key_leaves_out_the_library_and_holds_flags_and_torch() -> None:
    def key(job: types.SimpleNamespace, torch_id: str = "2.13.0 abc") -> str:
        return pch.key_of(
            job.identity,
            "gcc",
            " ".join(stable_fast.pch_flags(job, "/torch/include", torch_id)),
            ["#include <a>"],
        )

    # shared by every library (its folder is not in it)
    assert key(_job("/lib/a")) == key(_job("/lib/b"))
    assert key(_job("/lib/a")) != key(_job("/lib/a", ("-O1",)))  # not used when the flags differ
    # nor under another torch's headers
    assert key(_job("/lib/a")) != key(_job("/lib/a"), "2.14.0 def")
    assert all("JITOPS_NS" not in w for w in stable_fast.pch_flags(_job("/lib/a"), "/i", "t"))
    # link words that change the one compile-and-link command's compile are the PCH's too (-fopenmp:
    # _OPENMP)
    assert key(_job("/lib/a", ldflags=("-fopenmp",))) != key(_job("/lib/a"))
    assert key(_job("/lib/a", ldflags=("-lm", "-L/x"))) == key(_job("/lib/a"))


@pytest.mark.compile
def test_the_link_stub_is_made_once_per_process_in_the_build_folder(tmp_path: Path) -> None:
    """A stub with libtorch_cpu's SONAME, made by the build's runner once per process and written into each
    build's own folder (nothing in the cache); flags that forbid undefined symbols get the real library."""
    real = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    name = stable_fast.soname(real)
    assert name is not None and name.startswith("libtorch_cpu")
    ran: list[list[str]] = []

    def run(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
        ran.append(cmd)
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True).returncode, ""

    stable_fast._stubs.clear()
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    stub = stable_fast.link_stub(_job(str(one)), real, run)
    assert stub is not None and stub.parent == one and stable_fast.soname(str(stub)) == name
    assert stub.stat().st_size < 100_000 and len(ran) == 1
    # the next build: the same bytes, no command
    again = stable_fast.link_stub(_job(str(two)), real, run)
    assert (
        again is not None
        and again.parent == two
        and again.read_bytes() == stub.read_bytes()
        and len(ran) == 1
    )
    for flag in ("-Wl,-z,defs", "-Wl,--no-undefined"):
        assert stable_fast.link_stub(_job(str(two), ldflags=(flag,)), real, run) is None


@pytest.mark.compile
def test_a_stub_begun_on_the_miss_is_taken_by_the_build_and_a_failed_one_is_made_again(
    tmp_path: Path,
) -> None:
    """start_stub (entry.before_first_build, for a stable plan) makes the stub in a thread; link_stub takes its bytes
    and runs nothing. One that failed (a compiler that does not exist) leaves link_stub to make it with the runner."""
    real = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    ran: list[list[str]] = []

    def run(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
        ran.append(cmd)
        return subprocess.run(
            ["c++", *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True
        ).returncode, ""

    stable_fast._stubs.clear()
    stable_fast.start_stub("c++", real, dict(os.environ))
    # once per process: the second call begins nothing
    stable_fast.start_stub("c++", real, dict(os.environ))
    assert len(stable_fast._early) == 1
    stub = stable_fast.link_stub(_job(str(tmp_path)), real, run)
    assert (
        stub is not None and ran == [] and stable_fast.soname(str(stub)) == stable_fast.soname(real)
    )
    assert stable_fast._early == {}
    (tmp_path / "b").mkdir()
    missing = str(tmp_path / "no-such-compiler")
    stable_fast.start_stub(missing, real, dict(os.environ))
    job = types.SimpleNamespace(**{**vars(_job(str(tmp_path / "b"))), "cxx": missing})
    again = stable_fast.link_stub(job, real, run)
    assert again is not None and len(ran) == 1 and again.read_bytes() == stub.read_bytes()
    stable_fast._stubs.clear()


@pytest.mark.compile
def test_a_link_that_forbids_undefined_symbols_builds_against_the_real_library() -> None:
    """`-z defs` needs the shim's symbols: the stub has none, so such a build links against libtorch_cpu."""
    lib = jitops.load_inline(
        "stable_zdefs",
        FIRST.replace("* static_cast<float>(s)", "* 3.0f"),
        extra_ldflags=["-Wl,-z,defs"],
    )
    assert lib.library.manifest.timings["link"] == stable.SHIM_LIBRARY
    torch.testing.assert_close(_with_fake(lib).scale(torch.ones(2), 1.0), torch.full((2,), 3.0))


def test_pch_words_reach_the_compiler_unquoted_and_background_off_builds_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pch.pch_words are quoted for ninja's shell; the stable builder runs an argv list, so a cache path with a
    space must reach g++ as one plain word. JITOPS_PCH_BACKGROUND=0: no detached child, no PCH."""
    src = tmp_path / "k.cpp"
    src.write_text("#include <torch/csrc/stable/library.h>\nint x;\n")
    job = _job(str(tmp_path), cache=Cache(tmp_path / "my cache"))
    job.sources, job.pch, job.pch_build, job.pch_background = (src,), "gcc", True, True
    where = tmp_path / "my cache" / "v1" / "pch" / "k"
    monkeypatch.setattr(
        pch,
        "find",
        lambda cache, key, kind: types.SimpleNamespace(
            words=pch.pch_words(kind, where), deps={"/usr/include/x.h": "0" * 64}
        ),
    )
    words, state, later, read = stable_fast.use_pch(job, "/torch/include", "t")
    assert (
        state == "hit"
        and words == ["-include", str(where / pch.HEADER), "-Winvalid-pch"]
        and not later
        and read == {"/usr/include/x.h": "0" * 64}
    )
    monkeypatch.setattr(pch, "find", lambda cache, key, kind: None)
    assert stable_fast.use_pch(job, "/torch/include", "t")[1:3] != ("off (background)", {})
    job.pch_background = False
    assert stable_fast.use_pch(job, "/torch/include", "t") == ([], "off (background)", {}, {})


@pytest.mark.compile
def test_a_stable_build_needs_no_ninja_and_starts_no_self_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One compiler command builds a stable kernel: a machine without ninja still builds it, and the self-check
    (a C++-API probe) is neither started nor imported for it."""
    from jitops.build import entry
    from jitops.base.settings import Settings
    from jitops.errors import ToolchainError
    from jitops.target import toolchain

    def no_ninja(op: str) -> str:
        raise ToolchainError(f"cannot build op {op!r}: ninja is not installed")

    monkeypatch.setattr(toolchain, "find_ninja", no_ninja)
    settings = Settings.from_env({})
    # its link stub begins with the default c++
    stable_plan = types.SimpleNamespace(
        ingredients={"abi": "stable", "compiler": "g++"},
        spec=types.SimpleNamespace(name="k"),
        compiler=None,
    )
    assert entry.before_first_build(stable_plan, settings) is None  # type: ignore[arg-type]
    other = types.SimpleNamespace(
        ingredients={"compiler": "g++"}, spec=types.SimpleNamespace(name="k")
    )
    with pytest.raises(ToolchainError, match="ninja"):
        entry.before_first_build(other, settings)  # type: ignore[arg-type]
    # a real build
    lib = jitops.load_inline("stable_noninja", FIRST.replace("* static_cast<float>(s)", "* 4.0f"))
    torch.testing.assert_close(_with_fake(lib).scale(torch.ones(2), 1.0), torch.full((2,), 4.0))


@pytest.mark.parametrize(
    "header, prefix",
    [
        ("#pragma once\n#include <a.h>\n// c\n#include <b.h>\nint x;\n", ["<a.h>", "<b.h>"]),
        ("#ifndef K_H\n#define K_H\n#include <a.h>\n#endif\n", ["<a.h>"]),
        # a macro before the includes changes what they mean: not compiled ahead of it
        ("#define FAST 1\n#include <a.h>\n", []),
        ("#ifndef K_H\n#define OTHER\n#include <a.h>\n", []),
        ("#include <a.h>\n#pragma once\n#define X\n#include <b.h>\n", ["<a.h>"]),
        ("int x;\n#include <a.h>\n", []),
    ],
)
def test_a_local_first_header_lends_its_leading_system_includes(
    tmp_path: Path, header: str, prefix: list[str]
) -> None:
    """A source whose first line includes a local header gets that header's leading system includes
    as its PCH prefix (found where the compiler finds it), after only a guard or ``#pragma
    once``."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "k.h").write_text(header)
    src = '// kernel\n#include "k.h"\n#include <c.h>\nint y;\n'
    want = [f"#include {h}" for h in prefix]
    assert pch.local_prefix(src, tmp_path, [tmp_path / "inc"]) == want
    assert pch.local_prefix(src, tmp_path, []) == []  # not found: no prefix
    assert pch.local_prefix('#include "/abs/k.h"\n', tmp_path, [tmp_path / "inc"]) == []
    assert pch.local_prefix("int z;\n" + src, tmp_path, [tmp_path / "inc"]) == []


@pytest.mark.compile
def test_a_kernel_behind_a_local_header_uses_the_shared_stable_pch(
    built: jitops.UserLibrary, tmp_path: Path
) -> None:
    """The stable headers' PCH serves a kernel that includes them through its own ``kernel.h``."""
    assert pch_bg.wait(300)
    head, body = FIRST.split("\nusing torch::stable::Tensor;", 1)
    (tmp_path / "kernel.h").write_text("#pragma once\n" + head + "\n")
    src = tmp_path / "kernel.cpp"
    body = body.replace("* static_cast<float>(s)", "* 3.0f")
    src.write_text('#include "kernel.h"\nusing torch::stable::Tensor;' + body)
    lib = jitops.load("stable_local_header", [str(src)])
    assert lib.library.manifest.timings["files"]["kernel.cpp"]["pch"] == "hit"
    torch.testing.assert_close(lib.scale(torch.ones(3), 1.0), torch.full((3,), 3.0))


def test_no_shared_pch_when_the_library_holds_a_prefix_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header of the prefix that the library's own folder also holds (a vendored ``<error.h>``):
    the compile reads that one, the shared PCH was made from the other, so no PCH is used or made,
    even when one exists for the prefix."""
    src = tmp_path / "k.cpp"
    src.write_text("#include <torch/csrc/stable/library.h>\n#include <error.h>\nint x;\n")
    job = _job(str(tmp_path), cache=Cache(tmp_path / "cache"))
    job.sources, job.pch, job.pch_build, job.pch_background = (src,), "gcc", True, True
    found = types.SimpleNamespace(words=["-include", "x"], deps={})
    monkeypatch.setattr(pch, "find", lambda cache, key, kind: found)
    assert stable_fast.use_pch(job, "/torch/include", "t")[1] == "hit"
    (tmp_path / "error.h").write_text("#define _ERROR_H 1\n#define AUD_V 7\n")
    assert stable_fast.use_pch(job, "/torch/include", "t") == ([], "shadowed", {}, {})


# A three-file stable library: two helpers (one reading a header of the library's folder) and the
# op.
_HELPER_H = "#pragma once\n#define TWICE_BY TAG\n"
_TWICE = '#include "helper.h"\nfloat twice_TAG(float v) { return v * TWICE_BY; }\n'
_HALF = "float half_TAG(float v) { return v * 0.5f; }\n"
_OP = SCALE.replace(
    "using torch::stable::Tensor;",
    "using torch::stable::Tensor;\nfloat twice_TAG(float v);\nfloat half_TAG(float v);",
).replace("FACTOR", "half_TAG(twice_TAG(xp[i])) + OFFSET")


def _three_files(root: Path, tag: str, offset: str = "0.0f", by: str = "2.0f") -> list[str]:
    """Write the library (names and the helper's factor carry ``tag``: objects no other test
    made)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "helper.h").write_text(_HELPER_H.replace("TAG", by))
    (root / "twice.cpp").write_text(_TWICE.replace("TAG", tag))
    (root / "half.cpp").write_text(_HALF.replace("TAG", tag))
    (root / "op.cpp").write_text(_OP.replace("TAG", tag).replace("OFFSET", offset))
    return [str(root / f) for f in ("twice.cpp", "half.cpp", "op.cpp")]


def _compiled(lib: jitops.UserLibrary) -> list[str]:
    files = lib.library.manifest.timings["files"]
    assert set(files) == {"twice.cpp", "half.cpp", "op.cpp"}
    assert all(i["object"] in ("cached", "compiled") for i in files.values())
    assert all(i["seconds"] > 0 for i in files.values() if i["object"] == "compiled")
    return sorted(f for f, i in files.items() if i["object"] == "compiled")


@pytest.mark.compile
def test_a_several_file_stable_library_recompiles_only_what_changed(tmp_path: Path) -> None:
    """Objects come from the object cache when their source, every header they read, their flags and
    the compiler are unchanged. Editing the op's file compiles it alone; editing a header one helper
    includes compiles that helper (and the op's file, which spells JITOPS_NS: the namespace is the
    key's, so any edit gives it a new one), never the other helper. Each result is the edited
    code's."""
    sources = _three_files(tmp_path / "lib", "u1")
    x = torch.arange(4, dtype=torch.float32)
    first = _with_fake(jitops.load("stable_three", sources))
    assert _compiled(first) == ["half.cpp", "op.cpp", "twice.cpp"]
    torch.testing.assert_close(first.scale(x, 1.0), x)  # half(twice(x))
    _three_files(tmp_path / "lib", "u1", offset="1.0f")
    edited = _with_fake(jitops.load("stable_three", sources))
    assert _compiled(edited) == ["op.cpp"]
    torch.testing.assert_close(edited.scale(x, 1.0), x + 1)
    _three_files(tmp_path / "lib", "u1", offset="1.0f", by="4.0f")
    header = _with_fake(jitops.load("stable_three", sources))
    assert _compiled(header) == ["op.cpp", "twice.cpp"]
    torch.testing.assert_close(header.scale(x, 1.0), 2 * x + 1)


@pytest.mark.compile
def test_a_syntax_error_in_one_file_of_a_stable_library_names_it(tmp_path: Path) -> None:
    """A failing compile stops the build, and its error names the file and its line."""
    sources = _three_files(tmp_path / "lib", "u2")
    (tmp_path / "lib" / "half.cpp").write_text("float half_u2(float v) { return v * 0.5f }\n")
    with pytest.raises(jitops.BuildError) as e:
        jitops.load("stable_three_bad", sources)
    assert "half.cpp:1" in str(e.value), str(e.value)
    assert "twice.cpp:" not in str(e.value) and "op.cpp:" not in str(e.value)


@pytest.mark.compile
def test_a_stable_librarys_files_compile_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to the job count at once: each compile waits (at most 60 s) until another is running
    beside it, so compiles run one after another never see two at once. Their recorded start and end
    times overlap too."""
    import threading
    import time

    from jitops.build import runner

    real = runner.run_supervised
    running, met, lock = [0], threading.Event(), threading.Lock()
    spans: list[tuple[float, float]] = []

    def watched(cmd: list[str], **kw: object) -> tuple[int, str]:
        if "-c" not in cmd:  # the link, the stub
            return real(cmd, **kw)  # type: ignore[arg-type]
        with lock:
            running[0] += 1
            if running[0] >= 2:
                met.set()
        met.wait(60)
        began = time.monotonic()
        try:
            return real(cmd, **kw)  # type: ignore[arg-type]
        finally:
            with lock:
                running[0] -= 1
                spans.append((began, time.monotonic()))

    monkeypatch.setenv("MAX_JOBS", "3")
    monkeypatch.setattr(runner, "run_supervised", watched)
    lib = _with_fake(jitops.load("stable_three_par", _three_files(tmp_path / "lib", "u3")))
    assert met.is_set() and len(spans) == 3
    files = lib.library.manifest.timings["files"]
    assert [i["object"] for i in files.values()] == ["compiled"] * 3
    times = sorted((i["started"], i["ended"]) for i in files.values())
    assert any(b[0] < a[1] for a, b in zip(times, times[1:])), times
    x = torch.arange(3, dtype=torch.float32)
    torch.testing.assert_close(lib.scale(x, 1.0), x)
