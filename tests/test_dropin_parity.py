"""The drop-in gives torch's results (issue 32): headers, bindings, include paths.

* The stand-in for <torch/extension.h> reaches exactly the system headers and feature macros the
  real header reaches, so math functions on floats resolve to the same overloads (two preprocessor
  runs, two -O0 compiles of a probe).
* ``functions=`` are torch's pybind11 bindings: the GIL held (the autograd engine refuses to run,
  as under torch), a body that releases and retakes the GIL works, docstrings, argument names and
  pybind11's conversions (a child: a crash must fail the test, not end it).
* Include paths and flags as torch takes them: padded with whitespace, missing folders.
* A warm drop-in load imports no build code.

DeepSpeed's optimizers, a real client, are in tests/test_dropin_deepspeed.py.
"""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.cpp_extension as ce

import jitops
from jitops.api import cpp_ext_style
from jitops.build import tubuild
from tests.helpers import run_scenario
from tests.scenarios_dropin import GIL_FUNCTIONS

STANDIN = str(tubuild.STANDIN)
TORCH_INCLUDE = str(Path(ce.include_paths()[0]))


def _cxx(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    includes = [
        w for d in [*ce.include_paths(), sysconfig.get_path("include")] for w in ("-isystem", d)
    ]
    # C++20, as torch's loader compiles: torch 2.14's headers stop with #error under anything older.
    return subprocess.run(
        ["g++", "-std=c++20", "-DTORCH_API_INCLUDE_EXTENSION_H", *includes, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )


def _system_headers(trace: str) -> set[str]:
    """The headers outside torch's include folder that ``-H`` shows were read (the stand-in itself aside)."""
    found = {m.group(1) for m in re.finditer(r"^\.+ (\S+)$", trace, re.MULTILINE)}
    return {p for p in found if not p.startswith(TORCH_INCLUDE) and not p.startswith(STANDIN)}


def _macros(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#define (\w+)(.*)$", text, re.MULTILINE))  # type: ignore[misc]


# Macros only the real header defines are torch's, pybind11's and Python's API, never a system
# header's.
_API_MACRO = re.compile(
    r"(PYBIND11|Py|_Py|PY|TORCH|_TORCH|AT|C10|CAFFE2|THP|CATCH|_CATCH|FORALL|STRONG|ROLLBEAR"
    r"|HANDLE_TH|END_HANDLE_TH|SOFT_ASSERT|FORWARD_HAS|IS_PYBIND|PYTHONCAPI)"
)


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_the_stand_in_reads_the_real_headers_system_headers_and_feature_macros(
    tmp_path: Path,
) -> None:
    (tmp_path / "t.cpp").write_text("#include <torch/extension.h>\n")
    real = _cxx("-E", "-H", "t.cpp", "-o", "/dev/null", cwd=tmp_path).stderr
    lean = _cxx(f"-I{STANDIN}", "-E", "-H", "t.cpp", "-o", "/dev/null", cwd=tmp_path).stderr
    assert STANDIN in lean and STANDIN not in real
    real_headers, lean_headers = _system_headers(real), _system_headers(lean)
    assert any(p.endswith("/Python.h") for p in real_headers) and any(
        p.endswith("/math.h") for p in real_headers
    )
    assert lean_headers == real_headers, (
        sorted(real_headers - lean_headers),
        sorted(lean_headers - real_headers),
    )

    real_m = _macros(_cxx("-E", "-dM", "t.cpp", cwd=tmp_path).stdout)
    lean_m = _macros(_cxx(f"-I{STANDIN}", "-E", "-dM", "t.cpp", cwd=tmp_path).stdout)
    for name in (
        "_GNU_SOURCE",
        "_POSIX_C_SOURCE",
        "_XOPEN_SOURCE",
        "__USE_GNU",
        "__USE_XOPEN2K8",
        "__USE_MISC",
    ):
        assert lean_m.get(name) == real_m.get(name), name  # what libc declares
    assert {k: v for k, v in lean_m.items() if k in real_m and real_m[k] != v} == {}
    assert set(lean_m) - set(real_m) == {"JITOPS_EXTENSION_H_STANDIN"}
    assert [k for k in set(real_m) - set(lean_m) if not _API_MACRO.match(k)] == []


# Each probe's parameter type is the type of one call, so its mangled name records the overload
# chosen.
PROBE = r"""#include <torch/extension.h>
#define P(name, expr) void name(decltype(expr)) {}
P(p_sqrt_f, sqrt(1.5f)) P(p_exp_f, exp(1.5f)) P(p_log_f, log(1.5f)) P(p_pow_ff, pow(1.5f, 2.0f))
P(p_pow_fi, pow(1.5f, 2)) P(p_fabs_f, fabs(-1.5f)) P(p_abs_f, abs(-1.5f)) P(p_abs_l, abs(-3L))
P(p_abs_ll, abs(-3LL)) P(p_floor_f, floor(1.5f)) P(p_tanh_f, tanh(1.5f)) P(p_fmax_f, fmax(1.5f, 2.f))
P(p_div_l, div(7L, 2L)) P(p_round_f, round(1.5f)) P(p_sin_h, sin(c10::Half(1)))
P(p_min, std::min(1.5f, 2.f)) P(p_max, std::max<int64_t>(1, 2)) P(p_isnan_f, isnan(1.5f))
float float_math(float v, float m) { return sqrt(v) / (sqrt(m) + 1e-8f) + exp(-v) * pow(v, 2.f) + fabs(m); }
"""


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_math_on_floats_resolves_as_with_the_real_header(tmp_path: Path) -> None:
    """DeepSpeed's cpu_adam.h calls an unqualified sqrt on floats: float under the real header (Python.h brings
    <math.h>'s overloads), and so under the stand-in; never C's double sqrt(double)."""
    (tmp_path / "probe.cpp").write_text(PROBE)
    symbols = {}
    for kind, extra in (("real", []), ("lean", [f"-I{STANDIN}"])):
        _cxx(
            *extra,
            "-O0",
            "-fPIC",
            "-ffunction-sections",
            "-c",
            "probe.cpp",
            "-o",
            f"{kind}.o",
            cwd=tmp_path,
        )
        nm = subprocess.run(
            ["nm", "--defined-only", f"{kind}.o"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        symbols[kind] = sorted(ln.split()[2] for ln in nm.splitlines() if ln.split()[1:2] == ["T"])
    assert symbols["lean"] == symbols["real"]
    # float, long: not double, int
    assert "_Z8p_sqrt_ff" in symbols["real"] and "_Z7p_abs_ll" in symbols["real"]
    # The object code of a function of the user's own: the same instructions (-O0, so no unit-wide
    # inlining).
    dis = {
        k: subprocess.run(
            ["objdump", "-d", "-r", "--no-show-raw-insn", "-j", ".text._Z10float_mathff", f"{k}.o"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for k in symbols
    }
    layout = (
        (r"^\s*[0-9a-f]+:\s*", ""),
        (r"\b[0-9a-f]+ <", "<"),
        (r"(\.rodata[.\w]*)[+-]0x[0-9a-f]+", r"\1"),
    )

    def plain(
        line: str,
    ) -> str:  # addresses and constant-pool offsets are the layout of the whole file
        for pattern, repl in layout:
            line = re.sub(pattern, repl, line)
        return line

    body = {
        k: [plain(ln) for ln in v.split("<_Z10float_mathff>:\n", 1)[1].splitlines()]
        for k, v in dis.items()
    }
    # std::sqrt(float)
    assert body["lean"] == body["real"] and any("_ZSt4sqrtf" in ln for ln in body["real"])


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_functions_are_torchs_bindings_gil_docstrings_and_conversions() -> None:
    reply = run_scenario("scenarios_dropin.gil_and_docstrings", loader="jitops", timeout=900)
    assert reply.get("ok", True), reply  # the child did not crash or raise
    assert reply["holding"].startswith("The autograd engine was called while holding the GIL"), (
        reply["holding"]
    )
    assert reply["grad"] == [1.0, 1.0, 1.0]  # backward ran once the body released the GIL
    # released, retaken (a Python object made), held again on the way out
    assert reply["reacquire"] == 1020
    assert reply["bad_argument"].startswith(
        "release_then_reacquire(): incompatible function arguments"
    )
    for name, doc in GIL_FUNCTIONS.items():
        assert doc in reply["docs"][name] and reply["docs"][name].startswith(
            f"{name}(arg0: torch.Tensor"
        ), reply["docs"]
    # a body spelling pybind11's API is never run as a GIL-less dispatcher op
    assert reply["ops"] == []


def test_functions_get_dispatcher_ops_beside_unless_the_code_spells_python_api() -> None:
    """A body that releases or needs the GIL must never run as an op (ops run without the GIL); comments aside."""
    plain = cpp_ext_style.inline_files(
        "x",
        ["// bound as pybind11 would\nat::Tensor f(at::Tensor x) { return x; }"],
        [],
        {"f": "f"},
        implicit_headers=True,
        wrap_errors=True,
    )["x.cpp"]
    assert (
        "TORCH_LIBRARY_FRAGMENT(JITOPS_NS, m)" in plain and 'bind<&f, true>(m, "f", "f");' in plain
    )
    gil = cpp_ext_style.inline_files(
        "x",
        ["void g(at::Tensor x) { pybind11::gil_scoped_release no_gil; }"],
        [],
        {"g": "Doc"},
        implicit_headers=True,
        wrap_errors=False,
    )["x.cpp"]
    assert "TORCH_LIBRARY_FRAGMENT" not in gil and 'bind<&g, false>(m, "g", "Doc");' in gil


def test_functions_naming_no_function_are_refused_before_compiling() -> None:
    source = "torch::Tensor f(torch::Tensor x) { return x; }"
    with pytest.raises(jitops.KernelSourceError, match=r"'g' is not defined in cpp_sources.*Fix:"):
        jitops.load_inline("no_such_fn", source, functions=["f", "g"])
    with pytest.raises(jitops.KernelSourceError, match="'g' is not defined"):
        jitops.load_inline("no_such_fn", source, functions={"g": "doc"})


def test_what_torch_cannot_take_is_an_argument_error() -> None:
    for bad in (
        {"extra_include_paths": ["/usr/include\0x"]},
        {"extra_cflags": ["-O1", "-DX=\0"]},
        {"extra_include_paths": [3]},
        {"extra_ldflags": [b"-lm"]},
    ):
        with pytest.raises(jitops.ArgumentError):
            jitops.load_inline("refused", "int f() { return 1; }", functions=["f"], **bad)  # type: ignore[arg-type]


INCLUDED = r"""#include <torch/extension.h>
#include "scale.h"
torch::Tensor scaled(torch::Tensor x) { return x * SCALE; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scaled", &scaled, "scaled"); }
"""


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_include_paths_and_flags_as_torch_takes_them_and_a_warm_load_imports_no_build_code(
    tmp_path: Path,
) -> None:
    """Whitespace around a path or a flag is stripped, a missing folder is passed on (the compiler ignores it),
    as torch does; the key still covers the headers the compiler reads."""
    src, inc = tmp_path / "src", tmp_path / "inc"
    src.mkdir(), inc.mkdir()
    (src / "scaled.cpp").write_text(INCLUDED)
    (inc / "scale.h").write_text("#pragma once\n#define SCALE 3\n")
    args = {
        "extra_include_paths": [f"  {inc}\n", str(tmp_path / "missing")],
        "extra_cflags": [" -O1 \n"],
    }
    module = jitops.load("incl_parity", [str(src / "scaled.cpp")], **args)
    assert module.scaled(torch.ones(2)).tolist() == [3.0, 3.0]
    # the header the compiler reads is in the key
    (inc / "scale.h").write_text("#pragma once\n#define SCALE 5\n")
    edited = jitops.load("incl_parity", [str(src / "scaled.cpp")], **args)
    assert edited.scaled(torch.ones(2)).tolist() == [5.0, 5.0]

    def warm() -> Any:
        return run_scenario(
            "scenarios_dropin.warm_load",
            loader="jitops",
            folder=str(src),
            source="scaled.cpp",
            name="incl_parity",
            includes=args["extra_include_paths"],
            cflags=args["extra_cflags"],
            timeout=300,
        )

    replies = [warm(), warm()]
    build_code = {
        "jitops.build.runner",
        "jitops.build.tubuild",
        "jitops.build.ninja",
        "jitops.build.pch",
        "jitops.store.objcache",
        "jitops.build.publish",
        "jitops.store.lock",
        "jitops.loading.functionalize",
        "jitops.store.bundles",
        "jitops.build.freeze",
        "jitops.build.stable",
        "jitops.registry",
    }
    for reply in replies:  # issue 32 item 4: a hit imports only what a hit needs, starts no process
        ours = [m for m in reply["imported"] if m.startswith("jitops")]
        # 35: base.userdirs came in (it names the cache and state roots: no platformdirs),
        # api.verbose went out, store.inputs came in (a hit proves what its build read)
        assert (
            reply["value"] == [5.0, 5.0]
            and not build_code & set(ours)
            and len(ours) <= 35
            and "jitops.api.verbose" not in ours
        ), reply
        assert reply["spawned"] == [], reply
    # the library's op names were recorded: no listing of the dispatcher
    assert replies[1]["listed"] == 0, replies
    # An edit after warm loads (stamped library, recorded op names) is still seen: the key comes
    # from the bytes.
    (src / "scaled.cpp").write_text(INCLUDED.replace("x * SCALE", "x * SCALE + 1"))
    edited_reply = warm()
    # rebuilt (a compiler ran)
    assert edited_reply["value"] == [6.0, 6.0] and edited_reply["spawned"], edited_reply
