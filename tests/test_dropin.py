"""``from jitops import load, load_inline`` as drop-ins for torch.utils.cpp_extension's (issue 17).

The sources below are written as torch's tutorials and pytorch/extension-cpp write them, and
are used unchanged; only the import differs. The module's real builds, each once per session:
<torch/extension.h> + functions= (~30 s here), a PYBIND11_MODULE file and its edit (~30 s each);
with lean headers (a few seconds each): a fixed TORCH_LIBRARY namespace, functions= without the
implicit header and its edit, and one failing build.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.cpp_extension as ce

import jitops
from jitops.api import cpp_ext_style, dropin, verbose
from jitops import load as jit_load
from jitops import load_inline as jit_load_inline
from tests.helpers import run_scenario

pytestmark = [pytest.mark.compile, pytest.mark.timeout(600)]

# Style (a): the tutorial shape. No #include: load_inline prepends <torch/extension.h>.
SIN_ADD = r"""
torch::Tensor sin_add(torch::Tensor x, torch::Tensor y) {
  return x.sin() + y.sin();
}

torch::Tensor scale_shift(const torch::Tensor& x, double scale, int64_t shift) {
  return x * scale + shift;
}

std::tuple<torch::Tensor, torch::Tensor> min_max(torch::Tensor x) {
  return std::make_tuple(x.min(), x.max());
}

// `int` and std::vector<int> are pybind11 types, not dispatcher ones: bound with pybind11, as torch does.
torch::Tensor tile(torch::Tensor x, int times) {
  return x.repeat({times});
}

std::vector<int> shape_of(torch::Tensor x) {
  return std::vector<int>(x.sizes().begin(), x.sizes().end());
}

torch::Tensor checked(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2, "checked: expected a matrix, got ", x.dim(), " dims");
  return x.t();
}

// A hand-written loop over data_ptr: cannot run on torch.compile's fake tensors.
torch::Tensor raw_double(torch::Tensor x) {
  auto c = x.contiguous();
  auto out = torch::empty_like(c);
  const float* p = c.data_ptr<float>();
  float* q = out.data_ptr<float>();
  for (int64_t i = 0; i < c.numel(); ++i) q[i] = 2 * p[i];
  return out;
}
"""
SIN_ADD_FUNCTIONS = [
    "sin_add",
    "scale_shift",
    "min_max",
    "tile",
    "shape_of",
    "checked",
    "raw_double",
]

# Style (b): a file with its own module block.
PYBIND_EXT = r"""#include <torch/extension.h>

torch::Tensor d_sigmoid(torch::Tensor z) {
  auto s = torch::sigmoid(z);
  return (1 - s) * s * VERSION_SCALE;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("d_sigmoid", &d_sigmoid, "sigmoid'(z)");
  m.attr("version") = VERSION_SCALE;
}
"""

# Style (c): a fixed namespace, a schema written once, a CPU kernel; fake and autograd from Python.
MULADD = r"""#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

namespace dropin_demo {

at::Tensor mymuladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes(), "mymuladd: a and b must have one shape");
  TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat, "mymuladd: expected float32");
  at::Tensor a_c = a.contiguous(), b_c = b.contiguous();
  at::Tensor out = at::empty_like(a_c);
  const float* pa = a_c.data_ptr<float>();
  const float* pb = b_c.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); i++) po[i] = pa[i] * pb[i] + static_cast<float>(c);
  return out;
}

TORCH_LIBRARY(dropin_demo, m) { m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor"); }
TORCH_LIBRARY_IMPL(dropin_demo, CPU, m) { m.impl("mymuladd", &mymuladd_cpu); }

}  // namespace dropin_demo
"""

# functions= with lean headers and no implicit <torch/extension.h>: no pybind11 at all.
LEAN_FUNCTIONS = r"""#include <ATen/core/Tensor.h>
#include <ATen/ops/relu.h>

at::Tensor squared_relu(const at::Tensor& x) {
  at::Tensor r = at::relu(x);
  return r.mul(r);
}
"""


@pytest.fixture(scope="session")
def sin_add_module() -> Any:
    return jit_load_inline(
        "sin_add_ext", cpp_sources=SIN_ADD, functions=SIN_ADD_FUNCTIONS, extra_cflags=["-O1"]
    )


@pytest.fixture(scope="session")
def pybind_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pybind_ext")


def _pybind_source(folder: Path, scale: str) -> str:
    path = folder / "d_sigmoid.cpp"
    path.write_text(PYBIND_EXT.replace("VERSION_SCALE", scale))
    return str(path)


@pytest.fixture(scope="session")
def muladd(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The loaded library's path (torch's is_python_module=False result); fake and autograd registered once."""
    folder = tmp_path_factory.mktemp("muladd")
    (folder / "muladd.cpp").write_text(MULADD)
    path = jit_load(
        "dropin_demo_C", [str(folder / "muladd.cpp")], is_python_module=False, verbose=True
    )

    @torch.library.register_fake("dropin_demo::mymuladd")
    def _(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
        torch._check(a.shape == b.shape)
        return torch.empty_like(a)

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        a, b = ctx.saved_tensors
        return grad * b, grad * a, None

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])

    torch.library.register_autograd("dropin_demo::mymuladd", backward, setup_context=setup_context)
    return path  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the parameters


@pytest.mark.parametrize(
    ("ours", "theirs"), [(jitops.load, ce.load), (jitops.load_inline, ce.load_inline)]
)
def test_every_torch_parameter_is_accepted_in_torchs_order(ours: Any, theirs: Any) -> None:
    mine = inspect.signature(ours).parameters
    torch_params = inspect.signature(theirs).parameters
    positional = [n for n, p in mine.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    # The same names in the same order, so positional calls work too; later torch versions'
    # parameters after them (torch 2.15's load_inline adds gil_not_used), accepted under every
    # supported torch.
    assert positional[: len(torch_params)] == list(torch_params)
    assert set(positional[len(torch_params) :]) <= {"gil_not_used"}, positional
    for n, p in torch_params.items():
        assert mine[n].default == p.default, n
    # abi: jitops.build.stable
    assert {n for n, p in mine.items() if p.kind is p.KEYWORD_ONLY} == {
        "schemas",
        "device",
        "abi",
    }


def test_parameters_jitops_cannot_honour_are_refused_clearly() -> None:
    with pytest.raises(jitops.KernelSourceError, match="is_standalone=True asks for an executable"):
        jit_load("standalone", ["main.cpp"], is_standalone=True)
    with pytest.raises(jitops.KernelSourceError, match="does not build SYCL"):
        jit_load_inline("sycl_ext", "", sycl_sources="void f() {}")
    with pytest.raises(jitops.KernelSourceError, match="not the name of a C\\+\\+ function"):
        jit_load_inline("bad_functions", "int f();", functions=["f; system(0)"])
    with pytest.raises(jitops.InvalidNameError, match="Python identifier"):
        jit_load_inline("my-ext", "int f();", functions=["f"])


def test_with_cuda_picks_the_device() -> None:
    def device(with_cuda: bool | None, device: str | None = None) -> str | None:
        return dropin._common(None, False, with_cuda, None, None, True, False, device)

    assert (device(True), device(False), device(None), device(None, "cpu")) == (
        "cuda",
        "cpu",
        None,
        "cpu",
    )


def test_torch_names_map_to_cache_names() -> None:
    assert cpp_ext_style.spec_name("my_ext_C") == "my_ext_c"
    assert cpp_ext_style.spec_name("_Private") == "private"
    with pytest.raises(jitops.InvalidNameError):
        cpp_ext_style.spec_name("../evil")


def test_generated_bindings_follow_the_users_source() -> None:
    files = cpp_ext_style.inline_files(
        "x",
        ["#include <vector>", "int f(int a) { return a; }"],
        [],
        {"f": 'say "hi"'},
        implicit_headers=True,
        wrap_errors=True,
    )
    text = files["x.cpp"]
    lines = text.splitlines()
    # "#line 1": the compiler numbers the user's lines from 1 again (errors name the line of the
    # user's string)
    assert lines[:4] == [
        "#include <torch/extension.h>",
        "#line 1",
        "#include <vector>",
        "int f(int a) { return a; }",
    ]
    assert (
        'jitops::dropin::def<&f>(m, "f");' in text
        and 'bind<&f, true>(m, "f", "say \\"hi\\"")' in text
    )
    unwrapped = cpp_ext_style.inline_files(
        "x", ["int f(int a);"], [], {"f": "f"}, implicit_headers=True, wrap_errors=False
    )
    # with_pytorch_error_handling=False, as torch
    assert 'bind<&f, false>(m, "f", "f");' in unwrapped["x.cpp"]
    bare = cpp_ext_style.inline_files(
        "x", ["int f();"], ["__global__ void k() {}"], {}, implicit_headers=False, wrap_errors=False
    )
    assert bare == {"x.cpp": "int f();", "x_cuda.cu": "__global__ void k() {}"}


# ---------------------------------------------------------------- style (a): functions=


def test_functions_become_module_attributes_and_run(sin_add_module: Any) -> None:
    m = sin_add_module
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(m.sin_add(x, y), x.sin() + y.sin())
    torch.testing.assert_close(m.scale_shift(x, 2.0, 3), x * 2.0 + 3)
    lo, hi = m.min_max(x)
    assert lo == x.min() and hi == x.max()
    torch.testing.assert_close(m.tile(x, 2), x.repeat(2))
    assert m.shape_of(torch.zeros(2, 3)) == [2, 3]
    with pytest.raises(RuntimeError, match="checked: expected a matrix, got 1 dims"):
        m.checked(x)
    # module.f is torch's pybind11 binding (the GIL held, its docstring); beside it, dispatcher ops
    # where the signature allows (module.ops), none for `int` / std::vector<int>.
    assert isinstance(m.ops.sin_add.default, torch._ops.OpOverload) and isinstance(
        m.ops.checked.default, torch._ops.OpOverload
    )
    assert (
        type(m.sin_add).__name__ == "builtin_function_or_method" and m.sin_add.__name__ == "sin_add"
    )
    assert m.sin_add.__doc__.strip().endswith("sin_add") and m.sin_add.__doc__.startswith(
        "sin_add(arg0: torch.Tensor"
    )
    assert not hasattr(m.ops, "tile") and m.tile.__doc__.strip().endswith("tile")
    # Autograd flows through the ATen ops, as it does through torch's pybind11 bindings.
    xg = x.clone().requires_grad_()
    m.sin_add(xg, y).sum().backward()
    torch.testing.assert_close(xg.grad, x.cos())


def test_functions_work_under_torch_compile_and_opcheck(sin_add_module: Any) -> None:
    m = sin_add_module

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return m.ops.scale_shift(m.ops.sin_add(x, y), 0.5, 1)

    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(x, y), f(x, y))
    torch.library.opcheck(m.ops.sin_add.default, (x, y))
    torch.library.opcheck(m.ops.scale_shift.default, (x, 2.0, 3))


def test_functions_compile_as_torchs_bindings_do(sin_add_module: Any) -> None:
    """torch.compile meets module.f as it meets torch's pybind11 binding (a graph break, an eager call), so a
    kernel reading data_ptr() runs unchanged; as the raw op it cannot (fake tensors have no data)."""
    m = sin_add_module
    x = torch.randn(8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: m.raw_double(t.sin()) + 1, backend="aot_eager")
    torch.testing.assert_close(compiled(x), 2 * x.sin() + 1)
    with pytest.raises(Exception, match="data"):  # what the helper's wrapper spares a user
        torch.compile(lambda t: m.ops.raw_double(t) + 1, backend="aot_eager")(x)


def test_a_warm_load_in_a_fresh_process_does_not_import_dynamo(sin_add_module: Any) -> None:
    """module.f's graph-break marking costs no torch._dynamo import (1.2 s) on a warm load."""
    reply = run_scenario(
        "scenarios_inert.dropin_warm_load",
        name="sin_add_ext",
        source=SIN_ADD,
        functions=SIN_ADD_FUNCTIONS,
        call="sin_add",
        timeout=300,
    )
    assert not reply["dynamo_before"] and not reply["dynamo_after"], reply
    assert reply["out"] == pytest.approx(reply["want"]), reply
    # build/stable: only for a source naming STABLE_TORCH_LIBRARY, or abi= (issue 32)
    assert not reply["stable"], reply


def test_the_stable_abi_check_without_its_module_answers_as_it() -> None:
    """dropin asks build/stable only when a source names STABLE_TORCH_LIBRARY or abi= is given (its import is
    off the warm path); every answer, and the refusal of an unknown abi, stays stable.wanted's."""
    from jitops.build import stable

    texts = [
        "STABLE_TORCH_LIBRARY(ns, m) {}",
        "STABLE_TORCH_LIBRARY_IMPL (ns, CPU, m)",
        "STABLE_TORCH_LIBRARY_FRAGMENT\n(",
        "TORCH_LIBRARY(ns, m) {}",
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}",
        "NOT_STABLE_TORCH_LIBRARY(x)",
        "",
    ]
    for text in texts:
        for abi in (None, "stable"):
            assert dropin._stable_wanted("f", abi, [text]) == stable.wanted("f", abi, [text]), (
                text,
                abi,
            )
    assert dropin._stable_wanted("f", None, None) is stable.wanted("f", None, None) is False
    for bad in ("unstable", 1):
        with pytest.raises(jitops.ArgumentError, match="is not an ABI jitops builds for"):
            dropin._stable_wanted("f", bad, ["int x;"])


def test_same_source_same_module_and_no_rebuild(sin_add_module: Any) -> None:
    again = jit_load_inline(
        "sin_add_ext", cpp_sources=SIN_ADD, functions=SIN_ADD_FUNCTIONS, extra_cflags=["-O1"]
    )
    assert again is sin_add_module


def test_functions_without_pybind_are_ops_of_a_plain_module() -> None:
    m = jit_load_inline(
        "lean_fns", LEAN_FUNCTIONS, functions="squared_relu", no_implicit_headers=True
    )
    x = torch.randn(16)
    torch.testing.assert_close(m.squared_relu(x), torch.relu(x) ** 2)
    assert isinstance(m.squared_relu, torch._ops.OpOverload)
    compiled = torch.compile(lambda t: m.squared_relu(t) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.relu(x) ** 2 + 1)
    torch.library.opcheck(m.squared_relu, (x,))

    # an edit: a new op in a new namespace, same process
    edited = jit_load_inline(
        "lean_fns",
        LEAN_FUNCTIONS.replace("r.mul(r)", "r.mul(r).neg()"),
        functions="squared_relu",
        no_implicit_headers=True,
    )
    torch.testing.assert_close(edited.squared_relu(x), -(torch.relu(x) ** 2))
    # the old module keeps its own code
    torch.testing.assert_close(m.squared_relu(x), torch.relu(x) ** 2)
    assert edited.squared_relu.namespace != m.squared_relu.namespace


# ---------------------------------------------------------------- style (b): PYBIND11_MODULE


def test_a_pybind11_module_loads_and_an_edit_reloads_in_process(pybind_dir: Path) -> None:
    v1 = jit_load("sigmoid_ext", sources=[_pybind_source(pybind_dir, "1.0")])
    z = torch.randn(10)
    s = torch.sigmoid(z)
    torch.testing.assert_close(v1.d_sigmoid(z), (1 - s) * s)
    assert (
        v1.version == 1.0
        and jit_load("sigmoid_ext", sources=[str(pybind_dir / "d_sigmoid.cpp")]) is v1
    )

    # an edit: a new module, same process
    v2 = jit_load("sigmoid_ext", sources=[_pybind_source(pybind_dir, "2.0")])
    assert v2 is not v1 and v2.version == 2.0
    torch.testing.assert_close(v2.d_sigmoid(z), 2 * (1 - s) * s)
    torch.testing.assert_close(v1.d_sigmoid(z), (1 - s) * s)  # the old module keeps its own code
    assert v1.__name__ != v2.__name__  # TORCH_EXTENSION_NAME is unique per build


# ---------------------------------------------------------------- style (c): a fixed namespace


def test_a_fixed_namespace_library_works_with_python_fake_and_autograd(muladd: str) -> None:
    assert Path(muladd).is_file() and muladd.endswith(".so")
    a, b = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(torch.ops.dropin_demo.mymuladd(a, b, 1.5), a * b + 1.5)
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    torch.ops.dropin_demo.mymuladd(ag, bg, 0.0).sum().backward()
    torch.testing.assert_close(ag.grad, b)
    torch.testing.assert_close(bg.grad, a)
    compiled = torch.compile(
        lambda p, q: torch.ops.dropin_demo.mymuladd(p, q, 2.0) * 2, fullgraph=True
    )
    torch.testing.assert_close(compiled(a, b), (a * b + 2.0) * 2)
    torch.library.opcheck(torch.ops.dropin_demo.mymuladd.default, (a, b, 1.5))


def test_reloading_the_same_fixed_namespace_source_returns_the_loaded_library(
    muladd: str, tmp_path: Path
) -> None:
    same = tmp_path / "muladd.cpp"  # the same bytes elsewhere: the same key
    same.write_text(MULADD)
    assert jit_load("dropin_demo_C", [str(same)], is_python_module=False) == muladd


def test_an_edited_fixed_namespace_is_refused_before_building(muladd: str, tmp_path: Path) -> None:
    edited = tmp_path / "muladd.cpp"
    edited.write_text(MULADD.replace("+ static_cast<float>(c)", "- static_cast<float>(c)"))
    with pytest.raises(jitops.KernelSourceError) as info:
        jit_load("dropin_demo_C", [str(edited)], is_python_module=False)
    message = str(info.value)
    assert (
        "namespace 'dropin_demo'" in message
        and "already registered from a different build" in message
    )
    assert "JITOPS_LIBRARY" in message and "restart" in message
    a, b = torch.randn(3), torch.randn(3)
    # still the first build
    torch.testing.assert_close(torch.ops.dropin_demo.mymuladd(a, b, 1.0), a * b + 1.0)


def test_a_namespace_loaded_by_other_code_is_refused(tmp_path: Path) -> None:
    lib = torch.library.Library("dropin_elsewhere", "DEF")  # noqa: F841  (kept alive for the test)
    lib.define("f(Tensor x) -> Tensor")
    src = tmp_path / "elsewhere.cpp"
    src.write_text(MULADD.replace("dropin_demo", "dropin_elsewhere"))
    with pytest.raises(
        jitops.KernelSourceError, match="already registered by code jitops did not load"
    ):
        jit_load("elsewhere", [str(src)], is_python_module=False)


def test_a_library_without_a_python_module_still_loads_as_a_module(
    muladd: str, tmp_path: Path
) -> None:
    src = tmp_path / "muladd.cpp"
    src.write_text(MULADD)
    # is_python_module=True: a module with no functions
    module = jit_load("dropin_demo_C", [str(src)])
    assert module.__file__ == muladd


# ---------------------------------------------------------------- verbose and notes


def test_verbose_shows_the_build_and_build_directory_one_note(
    muladd: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dropin, "_noted", set())
    src = tmp_path / "muladd.cpp"
    src.write_text(MULADD)
    with caplog.at_level(logging.INFO, logger="jitops"):
        for _ in range(2):
            jit_load(
                "dropin_demo_C",
                [str(src)],
                build_directory=str(tmp_path / "build"),
                verbose=True,
                is_python_module=False,
            )
    notes = [r for r in caplog.records if "build_directory" in r.getMessage()]
    assert len(notes) == 1 and "content-addressed cache" in notes[0].getMessage()
    assert not (tmp_path / "build").exists()
    shown = [r.getMessage() for r in caplog.records if r.name == "jitops.verbose"]
    assert len(shown) == 2
    if "built dropin_demo" in shown[0]:  # built in this session: the compiler command line is shown
        assert "muladd.cpp" in shown[0] and " -c " in shown[0]
    else:
        assert "nothing was compiled" in shown[0]


def test_use_pch_is_accepted_with_one_note(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dropin, "_noted", set())
    with caplog.at_level(logging.INFO, logger="jitops"):
        for _ in range(2):
            m = jit_load_inline(
                "lean_fns",
                LEAN_FUNCTIONS,
                functions="squared_relu",
                no_implicit_headers=True,
                use_pch=True,
                keep_intermediates=False,
                gil_not_used=True,
            )
    x = torch.randn(4)
    torch.testing.assert_close(m.squared_relu(x), torch.relu(x) ** 2)
    notes = [r.getMessage() for r in caplog.records if "use_pch" in r.getMessage()]
    assert (
        len(notes) == 1
        and "never writes a precompiled header into the torch installation" in notes[0]
    )
    # torch 2.15's parameter
    gil = [r.getMessage() for r in caplog.records if "gil_not_used" in r.getMessage()]
    assert len(gil) == 1 and "does not declare itself free of the GIL" in gil[0]


def test_verbose_puts_a_failed_builds_log_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where logging is not configured (a plain notebook; pytest configures it), verbose output goes to stderr."""
    # no handler anywhere
    monkeypatch.setattr(verbose, "verbose_log", logging.Logger("unconfigured"))
    with pytest.raises(jitops.BuildError) as info:
        jit_load_inline(
            "broken_ext",
            "#include <ATen/core/Tensor.h>\nint f() { return undefined_thing; }",
            no_implicit_headers=True,
            verbose=True,
        )
    assert "undefined_thing" in str(info.value)  # the compiler's error is in the exception
    assert "undefined_thing" in capsys.readouterr().err


def test_compile_errors_name_the_line_of_the_users_string() -> None:
    """Issue 29 item 2: torch style prepends <torch/extension.h> (torch's own errors are then one line off), jitops
    style prepends nothing; both report the line of the user's string. A missing header fails at once (before
    the prepended header is parsed), so each build costs about a second."""
    torch_style = "int first = 1;\n#include <jitops_issue29_no_such_header.h>\n"
    jitops_style = "#include <jitops/op.h>\n\n#include <jitops_issue29_no_such_header.h>\nJITOPS_LIBRARY(m) {}\n"
    for name, text, line in (("lines_torch", torch_style, 2), ("lines_jitops", jitops_style, 3)):
        with pytest.raises(jitops.BuildError) as info:
            jit_load_inline(name, text)
        first = next(ln for ln in str(info.value).splitlines() if "error:" in ln)
        assert f"{name}.cpp:{line}:" in first and "jitops_issue29_no_such_header.h" in first, str(
            info.value
        )
        assert f"  >     {line} | #include <jitops_issue29_no_such_header.h>" in str(info.value), (
            str(info.value)
        )
