"""nvcc discovery and the nvcc/torch CUDA version check, with fake toolkits (tests/cuda_fakes.py).

jitops really runs the fake nvcc scripts; no compiler is involved.
"""

from __future__ import annotations

import importlib.util

import logging
import os
import time
from pathlib import Path

import pytest

from jitops.target import toolchain
import jitops.build.entry as jentry
import jitops.plan as jplan
import jitops.registry as jregistry
from jitops.errors import ToolchainError
from tests.cuda_fakes import fake_toolkit, gpu_system

# ------------------------------------------------------------------ pure


@pytest.mark.parametrize(
    ("text", "release"),
    [
        (
            "Cuda compilation tools, release 13.0, V13.0.88; Build cuda_13.0.r13.0/compiler.36424714_0",
            (13, 0),
        ),
        ("Cuda compilation tools, release 12.4, V12.4.131", (12, 4)),
        ("Build cuda_12.8.r12.8/compiler.35404655_0", (12, 8)),  # what older jitops recorded
        ("V11.8.89", (11, 8)),
        ("something else entirely", None),
    ],
)
def test_nvcc_release_parsing(text: str, release: tuple[int, int] | None) -> None:
    assert toolchain.nvcc_release(text) == release


def test_major_mismatch_shows_both_versions() -> None:
    with pytest.raises(ToolchainError) as e:
        toolchain.check_nvcc_matches_torch(
            "Cuda compilation tools, release 12.4, V12.4.131", "13.0", "softmax"
        )
    msg = str(e.value)
    assert "nvcc is CUDA 12.4" in msg and "torch was built with CUDA 13.0" in msg
    assert "'softmax'" in msg and "CUDA_HOME" in msg


def test_minor_difference_is_fine() -> None:
    toolchain.check_nvcc_matches_torch(
        "Cuda compilation tools, release 13.1, V13.1.80", "13.0", "softmax"
    )
    # CPU torch: nothing to compare
    toolchain.check_nvcc_matches_torch("release 12.4, V12.4.131", None, "softmax")


def test_unreadable_version_warns_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jitops"):
        toolchain.check_nvcc_matches_torch("weird wrapper 1.0", "13.0", "softmax")
    assert "cannot tell the CUDA version of nvcc from 'weird wrapper 1.0'" in caplog.text


# ------------------------------------------------------- fake toolkits


def test_version_line_kept_from_a_real_nvcc_run(tmp_path: Path) -> None:
    kit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    version = toolchain.identify(str(kit / "bin" / "nvcc"), None)
    assert (
        version
        == "Cuda compilation tools, release 13.0, V13.0.88; Build cuda_13.0.r13.0/compiler.36424714_0"
    )


@pytest.mark.parametrize("via", ["CUDA_HOME", "PATH"])
def test_mismatched_nvcc_is_refused_before_compiling(
    via: str, tmp_path: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    if via == "CUDA_HOME":
        system = gpu_system(None, CUDA_HOME=str(kit))
    else:
        system = gpu_system(None)
        monkeypatch.setenv("PATH", f"{kit / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(jplan, "probe", lambda **_: system)
    spec = jregistry.registry().library("softmax")
    plan = jplan.make_plan(spec, "cuda", "8.0,9.0")
    assert plan.ingredients["nvcc"]["path"] == str(kit / "bin" / "nvcc")
    assert isinstance(plan.toolchain_error, ToolchainError)
    start = time.monotonic()
    with pytest.raises(ToolchainError) as e:
        jentry.ensure_entry(plan)
    assert time.monotonic() - start < 2
    assert "nvcc is CUDA 12.4" in str(e.value) and "CUDA 13.0" in str(e.value)
    staging = private_cache / "v1" / "staging"
    assert not staging.exists() or not any(staging.iterdir())  # nothing was compiled
    assert not (private_cache / "v1" / "entries").exists()


def test_matching_nvcc_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    kit = fake_toolkit(tmp_path / "cuda-13.1", "13.1")
    monkeypatch.setattr(jplan, "probe", lambda **_: gpu_system(None, CUDA_HOME=str(kit)))
    plan = jplan.make_plan(jregistry.registry().library("softmax"), "cuda", "9.0")
    assert plan.toolchain_error is None
    assert "release 13.1" in plan.ingredients["nvcc"]["version"]


def test_cuda_home_without_nvcc_is_named(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="CUDA_HOME=.*has no bin/nvcc"):
        toolchain.find_nvcc(gpu_system(None, CUDA_HOME=str(tmp_path)), "softmax")
    kit = fake_toolkit(tmp_path / "noheaders", "13.0", headers=False)
    with pytest.raises(ToolchainError, match="include/cuda_runtime_api.h"):
        toolchain.find_nvcc(gpu_system(None, CUDA_HOME=str(kit)), "softmax")


def test_wrapper_script_on_path_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/usr/local/bin/nvcc``-style wrappers say nothing about where the CUDA headers are."""
    wrapper = fake_toolkit(tmp_path / "local", "13.0", headers=False) / "bin" / "nvcc"
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    real = "/usr/local/cuda/bin/nvcc"
    if os.path.isfile("/usr/local/cuda/include/cuda_runtime_api.h") and os.access(real, os.X_OK):
        assert toolchain.find_nvcc(gpu_system(None), "softmax") == os.path.realpath(real)
    else:
        with pytest.raises(ToolchainError, match="not inside a CUDA toolkit"):
            toolchain.find_nvcc(gpu_system(None), "softmax")


def test_build_ninja_gets_exactly_jitops_gencode_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cpp_extension adds its own arch flags unless ours are there; its CUDA_HOME is the chosen toolkit's;
    the CUDA libraries' headers from torch's wheels come after the toolkit's."""
    import torch.utils.cpp_extension as ce

    from jitops.build import ninja
    from jitops.build import runner as build
    from jitops.target.archs import arch_gencode_flags

    kit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    # must not reach nvcc: jitops decided the archs
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    installed = importlib.util.find_spec("nvidia")
    if installed is not None and installed.origin not in (None, "namespace"):
        # CUDA 12 wheels (torch 2.7.1+cu126) make `nvidia` a regular package: no second folder
        # merges in; use theirs
        libs = ninja.cuda_library_includes()[0]
    else:
        # as torch's CUDA wheels install it
        (tmp_path / "site" / "nvidia" / "cu13" / "include").mkdir(parents=True)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        libs = str(tmp_path / "site" / "nvidia" / "cu13" / "include")
    assert libs in ninja.cuda_library_includes()
    saved_home = ce.CUDA_HOME
    spec = jregistry.registry().library("softmax")
    gencode = arch_gencode_flags(("8.0", "9.0+PTX"))
    (tmp_path / "build").mkdir()
    job = build.BuildJob(
        library="softmax",
        target="cuda-sm80-sm90ptx",
        device="cuda",
        namespace="jitops_softmax_0123",
        sources=tuple(spec.root / s for s in spec.sources_for("cuda")),
        include_dirs=(spec.root,),
        cflags=("-O3",),
        cuda_cflags=("-O3", *gencode),
        ldflags=(),
        cxx="/usr/bin/c++",
        ninja="ninja",
        nvcc=str(kit / "bin" / "nvcc"),
        build_dir=tmp_path / "build",
        env={},
    )
    lines = ninja.write_ninja_file(job)[0].read_text().splitlines()
    value = {
        ln.split(" = ", 1)[0]: ln.split(" = ", 1)[1]
        for ln in lines
        if " = " in ln and not ln.startswith(" ")
    }
    assert value["nvcc"] == str(kit / "bin" / "nvcc")
    assert [w for w in value["cuda_cflags"].split() if "arch" in w] == list(gencode)
    words = value["cuda_cflags"].split()
    # the toolkit's headers win; libraries' fill gaps
    assert words.index(f"{kit}/include") < words.index(libs)
    assert libs in value["cflags"].split()
    assert f"-L{kit}/lib64" in value["ldflags"].split()
    assert "cuda_compile" in "\n".join(lines) and "softmax_cuda.cu" in "\n".join(lines)
    assert ce.CUDA_HOME == saved_home  # put back
