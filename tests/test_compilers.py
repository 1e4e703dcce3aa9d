"""Compilers other than g++: clang++ builds every builtin op (jitops/compilers.py).

The clang tests need Debian's ``clang`` package (`.ci/run` installs it); they
are skipped, saying so, where clang++ is absent.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from jitops.target import compilers, toolchain
from jitops.loading import loader
from jitops import registry
from jitops.errors import ToolchainError
from jitops.loading.ops import op_from_library
from jitops.target import probe

needs_clang = pytest.mark.skipif(
    shutil.which("clang++") is None,
    reason="needs clang++ (apt-get install clang; .ci/run installs it)",
)


@pytest.mark.parametrize(
    "line, kind, numbers",
    [
        ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc", (12, 2, 0)),
        ("c++ (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)", "gcc", (11, 4, 1)),
        ("x86_64-linux-gnu-g++-12 (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc", (12, 2, 0)),
        ("Debian clang version 14.0.6", "clang", (14, 0, 6)),
        ("Ubuntu clang version 18.1.3 (1ubuntu1)", "clang", (18, 1, 3)),
        ("Intel(R) oneAPI DPC++/C++ Compiler 2024.0.0", "unknown", ()),
    ],
)
def test_kind_of_reads_the_version_line(line: str, kind: str, numbers: tuple[int, ...]) -> None:
    assert compilers.kind_of(line) == (kind, numbers)


@pytest.mark.parametrize("version", ["g++ (GCC) 8.5.0 20210514", "clang version 9.0.1"])
def test_compilers_too_old_for_torch_are_refused_with_the_fix(version: str) -> None:
    with pytest.raises(ToolchainError, match=r"torch's headers need .* Fix: .*CXX"):
        compilers.check_supported(
            toolchain.Tool("cxx", "/opt/old/bin/c++", version, "/opt/old/bin/c++"), "softmax"
        )
    compilers.check_supported(toolchain.Tool("cxx", "/usr/bin/g++", "g++ (GCC) 9.4.0"), "softmax")


def test_gccs_collector_gets_a_larger_start_only_where_memory_allows() -> None:
    gcc, gib = "g++ (Debian 12.2.0-14+deb12u1) 12.2.0", 1 << 30
    words = compilers.gc_words(gcc, 2, ram=24 * gib)
    assert words == ("--param", "ggc-min-expand=100", "--param", "ggc-min-heapsize=1048576")
    assert compilers.gc_words(gcc, 8, ram=24 * gib) == ()  # 8 compiles of 1 GiB would not fit
    assert compilers.gc_words("Debian clang version 14.0.6", 1, ram=24 * gib) == ()


TEMPLATES = """#include <map>
#include <string>
#include <vector>
#include <algorithm>
template <class T> T total(const std::vector<T>& v) { T s{}; for (auto& x : v) s += x; return s; }
int f(int n) {
  std::map<std::string, std::vector<double>> m;
  for (int i = 0; i < n; ++i) m[std::to_string(i)].push_back(i * 0.5);
  std::vector<double> all;
  for (auto& [k, v] : m) all.push_back(total(v));
  std::sort(all.begin(), all.end());
  return static_cast<int>(total(all));
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_gccs_collector_words_leave_the_object_byte_identical(tmp_path: Path) -> None:
    """The words are in no key: they must change the compile's speed, never its output."""
    import subprocess

    src = tmp_path / "t.cpp"
    src.write_text(TEMPLATES)
    version = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
    words = compilers.gc_words(version.splitlines()[0], 1, ram=64 << 30)
    assert words
    objects = []
    for extra in ((), words, ("--param", "ggc-min-expand=10", "--param", "ggc-min-heapsize=4096")):
        out = tmp_path / f"t{len(objects)}.o"
        cmd = ["g++", "-O2", "-fPIC", "-std=c++17", *extra, "-c", str(src), "-o", str(out)]
        subprocess.run(cmd, check=True)
        objects.append(out.read_bytes())
    # the last collects from 4 MiB on, each time the heap grew a tenth: far more often than either
    assert objects[0] == objects[1] == objects[2]


def test_build_flags_swap_only_the_openmp_flag() -> None:
    clang = {"openmp": ["-fopenmp=libgomp", "-idirafter", "/usr/lib/gcc/x/12/include"]}
    assert compilers.build_flags(("-O3", "-fopenmp", "-mavx2"), clang) == (
        "-O3",
        "-fopenmp=libgomp",
        "-idirafter",
        "/usr/lib/gcc/x/12/include",
        "-mavx2",
    )
    assert compilers.build_flags(("-O3", "-fopenmp"), {"openmp": ["-fopenmp"]}) == (
        "-O3",
        "-fopenmp",
    )
    assert compilers.build_flags(("-O3", "-fopenmp"), None) == ("-O3", "-fopenmp")


@needs_clang
def test_clang_is_run_as_named_but_keyed_by_its_real_path(tmp_path: Path) -> None:
    system = probe({"CXX": "clang++"})
    named = toolchain.find_cxx(system, "softmax")
    # on main: the realpath, LLVM's `clang` (the C driver)
    assert os.path.basename(named) == "clang++"
    tool = compilers.cxx(system, "softmax", tmp_path / "toolchains")
    assert tool.run == named and tool.path == os.path.realpath(named)
    ingredient = compilers.ingredient(tool)
    assert ingredient["driver"] == "clang++" and "clang version" in ingredient["version"]
    # torch's OpenMP runtime (GNU libgomp), never LLVM's libomp (`cannot find -lomp` here)
    assert tool.openmp[0] == "-fopenmp=libgomp"
    assert os.path.isfile(os.path.join(tool.openmp[2], "omp.h"))


@needs_clang
def test_the_compiler_is_part_of_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path))
    spec = registry.lookup("softmax")
    keys = {}
    for cxx in ("g++", "clang++"):
        monkeypatch.setenv("CXX", cxx)
        keys[cxx] = loader.make_plan(spec, "cpu")
    assert keys["g++"].key != keys["clang++"].key
    assert keys["clang++"].ingredients["compiler"]["driver"] == "clang++"


@pytest.mark.compile
@pytest.mark.timeout(900)
@needs_clang
@pytest.mark.parametrize("library", ["softmax", "add", "nms"])
def test_clang_builds_every_builtin_op(library: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "clang++")
    # one clang build per library per session
    lib = loader.load_library(registry.lookup(library), "cpu")
    manifest = json.loads((lib.entry / "manifest.json").read_text())
    assert manifest["ingredients"]["compiler"]["driver"] == "clang++"
    assert "clang version" in manifest["ingredients"]["compiler"]["version"]
    torch.manual_seed(0)
    if library == "softmax":
        x = torch.randn(37, 300) * 4
        x[0, :5] = float("-inf")
        for name, ref in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
            op = op_from_library(lib, name)
            for dim in (-1, 0):
                torch.testing.assert_close(op(x, dim), ref(x, dim))
        y = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: op_from_library(lib, "softmax")(t, -1), (y,))
    elif library == "add":
        a, b = torch.randn(257, 129), torch.randn(129)
        torch.testing.assert_close(
            op_from_library(lib, "add")(a, b, alpha=2.5), torch.add(a, b, alpha=2.5)
        )
        i = torch.randint(-50, 50, (1000,))
        torch.testing.assert_close(op_from_library(lib, "add")(i, i, alpha=3), i + 3 * i)
    else:
        boxes = torch.rand(300, 4) * 100
        boxes[:, 2:] += boxes[:, :2]
        scores = torch.rand(300)
        keep = op_from_library(lib, "nms")(boxes, scores, 0.5)
        torch.testing.assert_close(keep, loader.reference("nms")(boxes, scores, 0.5))
    # A C++ error from a clang-built op arrives as a Python exception: RuntimeError from
    # TORCH_CHECK, IndexError from TORCH_CHECK_INDEX (softmax's dim check on integ), never a crash.
    with pytest.raises(IndexError if library == "softmax" else RuntimeError):
        if library == "nms":
            op_from_library(lib, "nms")(torch.rand(3, 5), torch.rand(3), 0.5)
        elif library == "add":
            op_from_library(lib, "add")(torch.randn(3), torch.randn(4))
        else:
            op_from_library(lib, "softmax")(torch.randn(3), 5)


@needs_clang
def test_doctor_reports_clang_its_binary_and_openmp_flags(tmp_path: Path) -> None:
    from jitops.cli import diagnose

    check = diagnose._compiler(probe({"CXX": "clang++"}), False, tmp_path / "toolchains")
    assert check.status == "ok", check
    assert (
        "clang++ -> " in check.detail
        and "clang version" in check.detail
        and "-fopenmp=libgomp" in check.detail
    )


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_compiler_asked_for_the_first_time_runs_each_question_once(tmp_path: Path) -> None:
    """The first build's identity: ``--version``, ``-###`` and the linker's name, each asked once
    (the identity is not asked again after the driver's programs when it was asked just before)."""
    asked = tmp_path / "asked"
    wrapper = tmp_path / "c++"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {asked}\nexec {shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    tool = toolchain.tool("cxx", str(wrapper), None, record=False)
    lines = asked.read_text().splitlines()
    assert sorted(w.split()[0] for w in lines) == sorted(
        ["--version", "-###", "-print-prog-name=ld"]
    ), lines
    assert "g++" in tool.version and dict(tool.programs)["compiler proper"]
    # a second process-wide ask is remembered: nothing runs
    assert toolchain.tool("cxx", str(wrapper), None, record=False).version == tool.version
    assert len(asked.read_text().splitlines()) == 3
