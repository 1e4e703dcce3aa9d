"""The drop-in loaders' edge cases, against torch 2.13's semantics (issue 17).

* ``with_cuda=None`` with CUDA sources: torch builds with CUDA; on this CPU-only torch jitops
  must say so (a TargetError naming the cause and the fix), not build the C++ part alone.
  Refused before anything is built: no compile.
* ``verbose=True``: the compiler's command lines arrive while the build runs, as torch streams
  ninja's output; and ``is_python_module=True`` for a library with no module and no op is
  torch's ImportError. Two real builds of headerless sources (a second or two each).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

import jitops
from jitops import load as jit_load
from jitops import load_inline as jit_load_inline
from jitops.store.cache import Cache

pytestmark = [pytest.mark.timeout(600)]
CPU_TORCH = pytest.mark.skipif(
    torch.version.cuda is not None, reason="a CUDA torch builds these for real"
)

CPP_DECL = "#include <ATen/core/Tensor.h>\nat::Tensor twice(const at::Tensor& x);\n"
CUDA_DEF = (
    "#include <ATen/core/Tensor.h>\nat::Tensor twice(const at::Tensor& x) { return x * 2; }\n"
)


@CPU_TORCH
def test_load_inline_with_cuda_sources_and_with_cuda_none_builds_for_cuda_as_torch_does() -> None:
    with pytest.raises(jitops.TargetError) as info:
        jit_load_inline(
            "edge_cuda_inline",
            CPP_DECL,
            cuda_sources=CUDA_DEF,
            functions=["twice"],
            no_implicit_headers=True,
        )
    msg = str(info.value)
    assert "cuda_sources were given and with_cuda=None" in msg and "CPU-only" in msg
    assert "Fix:" in msg and "with_cuda=False" in msg


@CPU_TORCH
def test_load_with_a_cu_file_and_with_cuda_none_builds_for_cuda_as_torch_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "twice.cpp").write_text(CPP_DECL)
    (tmp_path / "twice_kernel.cu").write_text(CUDA_DEF)
    with pytest.raises(
        jitops.TargetError, match=r"CUDA files \(twice_kernel\.cu\).*Fix:.*with_cuda=False"
    ):
        jit_load(
            "edge_cuda_files", [str(tmp_path / "twice.cpp"), str(tmp_path / "twice_kernel.cu")]
        )


def test_verbose_streams_the_build_and_a_library_without_a_module_is_an_import_error(
    session_cache: Path,
) -> None:
    cache = Cache(session_cache)
    seen: list[tuple[str, int]] = []  # (message, entries in the cache when it was shown)

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), len(cache.iter_entries())))

    watch = Watch()
    logging.getLogger("jitops.verbose").addHandler(watch)
    source = f"// {time.time_ns()}: a new build every run\nint answer() {{ return 42; }}\n"
    try:
        with pytest.raises(
            ImportError, match=r"no Python module.*Fix:.*is_python_module=False"
        ) as info:
            jit_load_inline("edge_no_module", source, no_implicit_headers=True, verbose=True)
    finally:
        logging.getLogger("jitops.verbose").removeHandler(watch)
    assert isinstance(info.value, jitops.NoPythonModuleError) and isinstance(
        info.value, jitops.KernelSourceError
    )
    commands = [(m, n) for m, n in seen if " -c " in m]
    assert commands, seen
    after = len(cache.iter_entries())
    # Each compiler command is its own line, shown before the library was published: live, as
    # torch's.
    assert all(n < after and "jitops: built" not in m for m, n in commands)
    path = jit_load_inline(
        "edge_no_module", source, no_implicit_headers=True, is_python_module=False
    )
    assert Path(
        path
    ).is_file()  # what torch returns with is_python_module=False: the loaded library's path


def test_load_of_a_file_without_a_module_is_an_import_error(tmp_path: Path) -> None:
    (tmp_path / "plain.cpp").write_text("int answer() { return 42; }\n")
    with pytest.raises(ImportError, match="PYBIND11_MODULE\\(TORCH_EXTENSION_NAME, m\\)"):
        jit_load("edge_plain", [str(tmp_path / "plain.cpp")])
    assert Path(
        jit_load("edge_plain", [str(tmp_path / "plain.cpp")], is_python_module=False)
    ).is_file()
