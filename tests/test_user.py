"""User kernels in one process: edit, reload, run; no rebuild when unchanged; failed builds retried.

These build real kernels. The sources are shared between tests on purpose
(same library name, file names and bytes mean the same cache key), so the
whole module costs seven compiles on a cold cache: two failures, five builds.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import jitops
from jitops.api import user
from jitops.target import choose_target, probe

pytestmark = pytest.mark.compile

KERNEL = r"""#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include "hot.h"

at::Tensor hot(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "hot: expected float32, got ", x.scalar_type());
  at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = HOT_SCALE * in[i] + OFFSET;
  return out;
}

JITOPS_LIBRARY(m) { m.def("hot(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("hot", &hot); }
"""
HEADER = "#pragma once\n#define HOT_SCALE {scale}f\n"
ERROR_LINE = 13  # the line of KERNEL that computes o[i]


def kernel(offset: str) -> str:
    return KERNEL.replace("OFFSET", offset)


# ---- subprocess audit: the warm path must start no process

_spawned: list[str] = []
_SPAWN_EVENTS = {
    "subprocess.Popen",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "os.exec",
    "os.fork",
}


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event in _SPAWN_EVENTS:
        _spawned.append(event)


sys.addaudithook(_audit)


@contextmanager
def spawns() -> Iterator[list[str]]:
    """The processes started inside the block (audit events)."""
    start = len(_spawned)
    seen: list[str] = []
    yield seen
    seen.extend(_spawned[start:])


@pytest.fixture
def include_dir(tmp_path: Path) -> Path:
    d = tmp_path / "include"
    d.mkdir()
    (d / "hot.h").write_text(HEADER.format(scale="2.0"))
    return d


def test_failed_build_is_retried_and_reports_the_error_in_the_users_source(
    include_dir: Path,
) -> None:
    broken = kernel("undefined_offset")
    target = choose_target(
        probe(), "cpu"
    ).name  # C++ sources only: a CPU library, on a GPU node too
    errors = []
    for _attempt in range(2):  # a failure never sticks: the second call runs the compiler again
        with spawns() as started, pytest.raises(jitops.BuildError) as info:
            jitops.load_inline("hot", broken, extra_include_paths=[str(include_dir)])
        assert "subprocess.Popen" in started
        errors.append(info.value)

    err = errors[-1]
    src = user.inline_dir("hot", {"hot.cpp": broken}) / "hot.cpp"
    # the compiler saw a real file holding exactly the user's string
    assert src.read_text() == broken
    col = broken.splitlines()[ERROR_LINE - 1].index("undefined_offset") + 1
    lines = str(err).splitlines()
    assert lines[0] == f"building op library 'hot' for {target} failed"
    assert re.fullmatch(
        rf"{re.escape(str(src))}:{ERROR_LINE}:{col}: error: .undefined_offset. was not declared in this scope",
        lines[1],
    ), lines[1]
    source = broken.splitlines()
    assert lines[2:8] == [
        f"    {ERROR_LINE - 2:5d} | {source[ERROR_LINE - 3]}".rstrip(),
        f"    {ERROR_LINE - 1:5d} | {source[ERROR_LINE - 2]}".rstrip(),
        f"  > {ERROR_LINE:5d} | {source[ERROR_LINE - 1]}",
        "          | " + " " * (col - 1) + "^",
        f"    {ERROR_LINE + 1:5d} | {source[ERROR_LINE]}",
        f"    {ERROR_LINE + 2:5d} | {source[ERROR_LINE + 1]}",
    ]
    assert lines[-2] == f"Fix: correct the first error above (hot.cpp:{ERROR_LINE}) and run again"
    assert lines[-1] == f"full log: {err.log_path}"
    assert len(lines) == 10 and len(lines) <= 40
    assert "undefined_offset" in Path(err.log_path).read_text()
    assert err.log == Path(err.log_path).read_text()
    frames = {Path(f.filename).name for f in traceback.extract_tb(err.__traceback__)}
    # the cell shows the compiler's story, not jitops's frames
    assert not frames & {"loader.py", "build.py"}, frames

    fixed = jitops.load_inline("hot", kernel("1.0f"), extra_include_paths=[str(include_dir)])
    x = torch.randn(257)
    torch.testing.assert_close(fixed.hot(x), 2.0 * x + 1.0)


def test_edit_reload_run_in_one_process(include_dir: Path) -> None:
    v1 = jitops.load_inline("hot", kernel("1.0f"), extra_include_paths=[str(include_dir)])
    x = torch.randn(1000)
    torch.testing.assert_close(v1.hot(x), 2.0 * x + 1.0)

    with spawns() as started:  # unchanged: the same object, no rebuild, no process started
        again = jitops.load_inline("hot", kernel("1.0f"), extra_include_paths=[str(include_dir)])
    assert again is v1 and started == []

    (include_dir / "hot.h").write_text(HEADER.format(scale="3.0"))  # a header edit rebuilds
    v2 = jitops.load_inline("hot", kernel("1.0f"), extra_include_paths=[str(include_dir)])
    torch.testing.assert_close(v2.hot(x), 3.0 * x + 1.0)

    # a source edit rebuilds
    v3 = jitops.load_inline("hot", kernel("-5.0f"), extra_include_paths=[str(include_dir)])
    torch.testing.assert_close(v3.hot(x), 3.0 * x - 5.0)

    namespaces = {lib.library.namespace for lib in (v1, v2, v3)}
    assert len(namespaces) == 3
    torch.testing.assert_close(v1.hot(x), 2.0 * x + 1.0)  # old handles keep running their own code
    torch.testing.assert_close(v2.hot(x), 3.0 * x + 1.0)
    assert v3.ops == {"hot": v3.hot} and "hot" in repr(v3)
    with pytest.raises(AttributeError, match="defines no op 'cold'; it defines: hot"):
        v3.cold  # noqa: B018


def test_load_from_files_and_register_kernel_dir(tmp_path: Path, include_dir: Path) -> None:
    folder = tmp_path / "hot"
    folder.mkdir()
    (folder / "hot.cpp").write_text(kernel("1.0f"))
    # Same library name, file name, bytes and include-path contents as load_inline above: the same
    # key.
    inline = jitops.load_inline("hot", kernel("1.0f"), extra_include_paths=[str(include_dir)])
    with spawns() as started:
        from_file = jitops.load(
            "hot", [str(folder / "hot.cpp")], extra_include_paths=[str(include_dir)]
        )
        spec = jitops.register_kernel_dir(folder, extra_include_paths=[str(include_dir)])
        op = jitops.get("hot")
    assert started == []
    assert from_file is inline
    assert spec.exports == ("hot",) and spec.name == "hot" and "hot" in jitops.list_ops()
    x = torch.randn(33)
    torch.testing.assert_close(op(x), 2.0 * x + 1.0)
    assert jitops.register_kernel_dir(
        folder, ops=["hot"], extra_include_paths=[str(include_dir)]
    ).exports == ("hot",)

    # Editing the folder in place: get() notices (file stamps), rebuilds, and returns the new op.
    op = jitops.get("hot")
    with spawns() as started:
        assert jitops.get("hot") is op  # unchanged: memoised, nothing started
    assert started == []
    (folder / "hot.cpp").write_text(kernel("-4.0f"))
    edited = jitops.get("hot")
    assert edited is not op and edited.library.namespace != op.library.namespace
    torch.testing.assert_close(edited(x), 2.0 * x - 4.0)
    torch.testing.assert_close(op(x), 2.0 * x + 1.0)  # the old handle keeps its own code
    assert jitops.get("hot") is edited


def test_bad_user_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(jitops.KernelSourceError, match="does not exist"):
        jitops.load("nothing_here", [str(tmp_path / "missing.cpp")])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(jitops.KernelSourceError, match="is not a source file"):
        jitops.load("nothing_here", [str(tmp_path / "notes.txt")])
    bad = tmp_path / "My-Kernels"
    bad.mkdir()
    (bad / "k.cpp").write_text("")
    with pytest.raises(jitops.KernelSourceError, match="pass name="):
        jitops.register_kernel_dir(bad)
    with pytest.raises(jitops.InvalidNameError):
        jitops.load_inline("../evil", "int x;")


def test_a_half_built_library_object_does_not_recurse() -> None:
    blank = user.UserLibrary.__new__(user.UserLibrary)  # what copy/pickle start from
    assert not hasattr(blank, "library") and not hasattr(blank, "anything")


SCALE = r"""#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

static void scale_into(const at::Tensor& x, double s, at::Tensor& out) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "scale: expected contiguous float32");
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<float>(s) * in[i];
}
at::Tensor scale(const at::Tensor& x, double s) { at::Tensor out = at::empty_like(x); scale_into(x, s, out); return out; }
at::Tensor& scale_(at::Tensor& x, double s) { scale_into(x, s, x); return x; }

JITOPS_LIBRARY(m) {
  m.def("scale(Tensor x, float s) -> Tensor");
  m.def("scale_(Tensor(a!) x, float s) -> Tensor(a!)");
}
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("scale", &scale); m.impl("scale_", &scale_); }
"""


def test_a_users_in_place_op_works_inside_torch_compile() -> None:
    """Schemas defined in C++, fake kernels by the user: jitops pairs scale_ with scale itself,
    so writing into a graph input with scale_ compiles with fullgraph=True."""
    lib = jitops.load_inline("scaler", SCALE)
    ns = lib.library.namespace
    torch.library.register_fake(f"{ns}::scale", lambda x, s: torch.empty_like(x))
    torch.library.register_fake(f"{ns}::scale_", lambda x, s: x)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        lib.scale_(y, 3.0)
        lib.scale_(x, 0.5)
        return y

    x = torch.randn(16)
    xe, xc = x.clone(), x.clone()
    eager = f(xe)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(xc)
    torch.testing.assert_close(got, 3.0 * (x + 1))
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(xc, 0.5 * x)  # the input mutation is replayed
