"""CUDA compile leg: a real nvcc build into a cache whose path sh would act on (issue 13 item 2).

nvcc runs the host compiler through sh with paths in double quotes and
backticks unescaped; before jitops kept such paths away from it, a cache
directory holding `` `cmd` `` or ``$(cmd)`` ran ``cmd``. One small library,
built once (~40-100 s here); needs a CUDA build of torch and nvcc, as the CI
CUDA leg has (``.ci/cuda-leg.sh``), and no GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cli_helpers import stripped_path
from tests.helpers import REPO, child_env, run_scenario

pytestmark = [pytest.mark.compile, pytest.mark.process]


def _nvcc() -> str | None:
    import torch

    if torch.version.cuda is None:
        return None
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc = os.path.join(home, "bin", "nvcc")
    return nvcc if os.access(nvcc, os.X_OK) else shutil.which("nvcc")


CPP = """#include <jitops/op.h>
JITOPS_LIBRARY(m) { m.def("odd_twice(Tensor x) -> Tensor"); }
"""
CU = """#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

__global__ void odd_twice_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

at::Tensor odd_twice(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "odd_twice: expected a float32 CUDA tensor");
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  int64_t n = xc.numel();
  if (n > 0) odd_twice_kernel<<<(unsigned)((n + 255) / 256), 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}

JITOPS_LIBRARY_IMPL(CUDA, m) { m.impl("odd_twice", &odd_twice); }
"""


def _gpu_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return "{}.{}".format(*torch.cuda.get_device_capability())


@pytest.mark.timeout(600)
def test_cuda_build_in_a_cache_path_with_shell_syntax_runs_nothing(tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs a CUDA build of torch and nvcc (the CUDA CI leg: .ci/cuda-leg.sh)")
    marks = tmp_path / "marks"
    marks.mkdir()
    # A path component cannot hold '/', so the commands name their files through the environment.
    odd = (
        tmp_path
        / "c $(touch $JITOPS_T_MARK1) `touch $JITOPS_T_MARK2` ; 'q' \"d\" ünï $HOME"
        / "cache"
    )
    # on a GPU node its own arch: jitops builds what the GPU runs, not what is asked
    arch = _gpu_arch() or "8.0"
    env = child_env(
        JITOPS_CACHE_DIR=str(odd),
        JITOPS_BUILDER=None,
        TORCH_CUDA_ARCH_LIST=arch,
        CUDA_HOME=os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
        MAX_JOBS="1",
        JITOPS_T_MARK1=str(marks / "one"),
        JITOPS_T_MARK2=str(marks / "two"),
    )
    r = run_scenario("load_inline_cuda", env=env, timeout=580, name="odd_twice", cpp=CPP, cu=CU)
    assert r.get("ok"), r
    assert (
        r["built"]
        and r["entry"].startswith(str(odd))
        and r["target"] == "cuda-sm" + arch.replace(".", "")
        and r["ops"] == ["odd_twice"]
    )
    assert sorted(os.listdir(marks)) == []  # nothing in the path was executed


EXT_CU = CU.replace(
    "#include <jitops/op.h>\n#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty_like.h>\n",
    "#include <jitops/op.h>\n#include <torch/extension.h>\n",
).replace("at::empty_like", "torch::empty_like")


@pytest.mark.timeout(600)
def test_a_cu_file_with_torch_extension_h_is_compiled_against_the_lean_stand_in(
    tmp_path: Path,
) -> None:
    """nvcc parses <torch/extension.h> with its own front end (67 s for a small kernel here, 27 s with
    <torch/types.h>): a .cu file that spells no Python API gets the stand-in too (issue 17)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs a CUDA build of torch and nvcc (the CUDA CI leg: .ci/cuda-leg.sh)")
    assert "<torch/extension.h>" in EXT_CU and "torch::empty_like" in EXT_CU
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_BUILDER=None,
        TORCH_CUDA_ARCH_LIST="9.0",
        CUDA_HOME=os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
        MAX_JOBS="2",
    )
    r = run_scenario(
        "load_inline_cuda",
        env=env,
        timeout=580,
        name="odd_ext",
        cpp=CPP.replace("odd_twice", "odd_ext"),
        cu=EXT_CU.replace("odd_twice", "odd_ext"),
    )
    assert r.get("ok"), r
    assert r["ops"] == ["odd_ext"] and r["target"] == "cuda-sm90"
    cu = [f for f in r["headers"] if f.endswith(".cu")]
    assert cu and all(r["headers"][f] == "lean torch/extension.h" for f in cu), r["headers"]
    # the .cu read torch's C++ headers (a slow one gets the split hint); the .cpp is no nvcc file
    assert r["torch_headers"] == cu, r


@pytest.mark.timeout(900)
def test_a_cuda_bundle_split_per_arch_family_serves_its_arch_with_no_compiler(
    tmp_path: Path,
) -> None:
    """``jitops bundle build --device cuda --arch 9.0,8.0 --split``: one single-arch nms entry per arch, one wheel per
    arch family. A machine with no nvcc and no C++ compiler that installs the sm9x wheel loads nms for 9.0 from it
    with builds forbidden, and for 8.0, which that wheel does not hold, gets the named error. No GPU here: the
    library is loaded, not run (the GPU tests run the kernels)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs a CUDA build of torch and nvcc (the CUDA CI leg: .ci/cuda-leg.sh)")
    dist = tmp_path / "dist"
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_PROGRESS="0",
        JITOPS_FREEZE=None,
        JITOPS_BUILDER=None,
        PYTHONPATH=str(REPO),
        CUDA_HOME=os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore::UserWarning",
            "-m",
            "jitops",
            "bundle",
            "build",
            "--device",
            "cuda",
            "--ops",
            "nms",
            "--arch",
            "9.0,8.0",
            "--split",
            "--out",
            str(dist),
            "--name",
            "fam",
            "--version",
            "1",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = {w.name.split("-")[0]: w for w in dist.glob("*.whl")}
    assert sorted(wheels) == ["jitops_bundle_fam_sm8x", "jitops_bundle_fam_sm9x"], proc.stdout
    for family, target in (("sm8x", "cuda-sm80"), ("sm9x", "cuda-sm90")):
        with zipfile.ZipFile(wheels[f"jitops_bundle_fam_{family}"]) as zf:
            assert sorted(n.split("/")[4] for n in zf.namelist() if n.endswith("/libnms.so")) == [
                target
            ]
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
            str(wheels["jitops_bundle_fam_sm9x"]),
        ],
        check=True,
        timeout=240,
    )
    bare = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "empty"),
        JITOPS_STATE_DIR=str(tmp_path / "state2"),
        JITOPS_PROGRESS="0",
        JITOPS_FREEZE="error",
        JITOPS_BUILDER=None,
        PYTHONPATH=os.pathsep.join((str(REPO), str(site))),
        PATH=stripped_path(tmp_path),
        CXX="/bin/false",
        CC=None,
        CUDA_HOME=None,
        TORCH_CUDA_ARCH_LIST=None,
    )
    got = run_scenario("scenarios_bundles.load_nms_cuda", env=bare, timeout=240, arch="9.0")
    assert (
        got["ok"]
        and got["built"] is False
        and got["target"] == "cuda-sm90"
        and got["entry"].startswith(str(site))
    ), got
    missing = run_scenario("scenarios_bundles.load_nms_cuda", env=bare, timeout=240, arch="8.0")
    assert (
        missing["ok"] is False and missing["type"] == "FrozenError" and "nms" in missing["msg"]
    ), missing
