"""The lean stand-in for <torch/extension.h> (issue 17: an edit -> rerun of a torch-style kernel).

A user library's C++ file that includes <torch/extension.h> and spells no Python API is compiled first
against jitops's stand-in (<torch/types.h>); a file that needs more is compiled again with the real
header, and an error the user sees is the real header's. Real builds: the tutorial kernel with the
stand-in (in process) and with JITOPS_LEAN_EXTENSION_H=0 (a child, own cache), one failing source,
one source that needs the C++ frontend (torch::nn) and its edit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import jitops
from jitops import cpp_ext_style, tubuild
from jitops.errors import BuildError
from tests.helpers import child_env, run_scenario

# The shape of torch's tutorials: the header, torch:: factories, AT_DISPATCH over data_ptr, TORCH_CHECK.
KERNEL = r"""#include <torch/extension.h>

torch::Tensor cube_plus(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 1, "cube_plus: expected a vector");
  auto c = x.contiguous();
  auto out = torch::zeros_like(c);
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "cube_plus", [&] {
    const scalar_t* p = c.data_ptr<scalar_t>();
    scalar_t* q = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i) q[i] = p[i] * p[i] * p[i] + scalar_t(0.5);
  });
  return out;
}

torch::Tensor soft(torch::Tensor x) {
  return torch::softmax(x, 0) * torch::ones({x.size(0)}, x.options());
}
"""
FUNCTIONS = ["cube_plus", "soft"]
INPUTS = [-1.5, -0.25, 0.0, 0.75, 2.0]

# Needs the C++ frontend (torch::nn), which only the real header declares.
FRONTEND = r"""#include <torch/extension.h>

torch::Tensor leaky(torch::Tensor x) {
  namespace F = torch::nn::functional;
  return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(SLOPE));
}
"""


def _library(module: Any) -> Any:
    return next(r.library for r in cpp_ext_style._results.values() if r.value is module)


def test_a_stand_in_is_tried_only_for_the_users_own_text() -> None:
    assert tubuild.wants_standin(KERNEL)
    assert tubuild.wants_standin("#include <torch/extension.h>\n" + cpp_ext_style.bindings({"f": "f"}, True))
    assert not tubuild.wants_standin("#include <ATen/ATen.h>\nint f();")  # nothing to stand in for
    for python in ("py::object f();", "PYBIND11_MODULE(x, m) {}", "PyObject* f();", "namespace py = pybind11;"):
        assert not tubuild.wants_standin("#include <torch/extension.h>\n" + python), python
    assert tubuild.wants_standin("// A PyTorch extension, as torch's tutorial writes it\n" + KERNEL)
    for python in ("PyErr_SetString(PyExc_ValueError, s);", "Py_INCREF(o);", "THPVariable_Wrap(t);"):
        assert not tubuild.wants_standin("#include <torch/extension.h>\n" + python), python
    assert "types.h" in (tubuild.STANDIN / "torch" / "extension.h").read_text()


def test_jitops_lean_extension_h_setting() -> None:
    from jitops.settings import Settings

    assert Settings.from_env({}).lean_extension_h
    assert Settings.from_env({"JITOPS_LEAN_EXTENSION_H": ""}).lean_extension_h
    assert not Settings.from_env({"JITOPS_LEAN_EXTENSION_H": "0"}).lean_extension_h


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_a_tutorial_kernel_builds_against_the_stand_in_and_behaves_as_with_the_real_header(tmp_path: Path) -> None:
    module = jitops.load_inline("lean_ext_demo", KERNEL, functions=FUNCTIONS, extra_cflags=["-O1"])
    lib = _library(module)
    files = lib.manifest.timings["files"]
    assert [i.get("header") for i in files.values()] == ["lean torch/extension.h"], files
    x = torch.tensor(INPUTS)
    torch.testing.assert_close(module.cube_plus(x), x ** 3 + 0.5)
    torch.testing.assert_close(module.soft(x), torch.softmax(x, 0))
    with pytest.raises(RuntimeError, match="cube_plus: expected a vector"):
        module.cube_plus(x.view(5, 1))
    # torch.compile meets module.f as torch's pybind11 binding (an eager call): the data_ptr loop runs.
    torch.testing.assert_close(torch.compile(lambda t: module.cube_plus(t) + 1, backend="aot_eager")(x), x ** 3 + 1.5)

    # The same source with the real header, in a fresh process and cache: the same key, the same results.
    reply = run_scenario("dropin_functions", name="lean_ext_demo", source=KERNEL, functions=FUNCTIONS, inputs=INPUTS,
                         env=child_env(JITOPS_LEAN_EXTENSION_H="0", JITOPS_CACHE_DIR=str(tmp_path / "cache")),
                         timeout=600)
    assert reply["key"] == lib.key  # the stand-in never changes an entry's key
    assert [i.get("header") for i in reply["timings"]["files"].values()] == [None], reply["timings"]
    assert reply["out"] == {f: getattr(module, f)(x).tolist() for f in FUNCTIONS}
    assert reply["compiled"]["cube_plus"] == (x ** 3 + 1.5).tolist()
    assert reply["pybind_module"]  # the real header brings pybind11's module; module.f behaves alike either way


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_a_compile_error_is_the_real_headers_and_names_the_users_line() -> None:
    broken = KERNEL.replace("c.numel()", "c.numell()")
    with pytest.raises(BuildError) as info:
        jitops.load_inline("lean_ext_broken", broken, functions=FUNCTIONS, extra_cflags=["-O1"])
    text = str(info.value) + (info.value.log or "")
    assert "numell" in text and "standin" not in text, text[-3000:]


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_a_file_needing_the_whole_header_builds_with_it_and_stays_on_it(caplog: pytest.LogCaptureFixture) -> None:
    x = torch.tensor(INPUTS)
    with caplog.at_level(logging.INFO, logger="jitops"):
        module = jitops.load_inline("lean_ext_frontend", FRONTEND.replace("SLOPE", "0.1"), functions=["leaky"],
                                    extra_cflags=["-O1"])
    torch.testing.assert_close(module.leaky(x), torch.nn.functional.leaky_relu(x, 0.1))
    assert [i.get("header") for i in _library(module).manifest.timings["files"].values()] == [None]
    assert any("needs more than jitops's lean stand-in" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jitops"):  # an edit: straight to the real header, no second try
        edited = jitops.load_inline("lean_ext_frontend", FRONTEND.replace("SLOPE", "0.2"), functions=["leaky"],
                                    extra_cflags=["-O1"], verbose=True)
    torch.testing.assert_close(edited.leaky(x), torch.nn.functional.leaky_relu(x, 0.2))
    assert not any("stand-in" in r.getMessage() for r in caplog.records), caplog.text


def test_an_edit_compiled_by_gcc_hints_once_at_clang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tubuild, "_hinted", [])
    clang = tmp_path / "clang++"
    clang.write_text("#!/bin/sh\n")
    clang.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    edit = {"files": {"k.cpp": {"object": "compiled", "pch": "hit"}}}
    assert tubuild.compiler_hint(edit, "clang") is None
    assert tubuild.compiler_hint({"files": {"k.cpp": {"pch": "first use"}}}, "gcc") is None  # not an edit yet
    assert "CXX=clang++" in (tubuild.compiler_hint(edit, "gcc") or "")
    assert tubuild.compiler_hint(edit, "gcc") is None  # once per process
