"""CUDA kernels on torch's stable ABI (build/stable.py): flags, key, refusals, a real nvcc build, a
GPU run.

The pure tests plan for a simulated CUDA torch (tests/cuda_fakes.py). The compile test runs the real
nvcc where one is installed (a CUDA torch is not needed: a stable kernel reads torch's headers and
links the C shim's library, both in the CPU wheel too) and checks the library's SASS, dependencies
and imports. The ``cuda`` test runs the kernel on a GPU against torch (benchmarks/gpu_session.sh
runs it).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
import types
from pathlib import Path

import pytest
import torch

import jitops
import jitops.plan as jplan
from jitops.build import entry, stable
from jitops.errors import ArgumentError, ConfigError, TargetError, ToolchainError
from jitops.key import STABLE_NVCC_FLAGS, compute_key, ingredients
from jitops.target import Target
from jitops.target.archs import arch_gencode_flags

from tests.cuda_fakes import gpu_system

KERNEL_DIR = Path(__file__).parent / "data" / "stable_cuda"
KERNEL = (KERNEL_DIR / "scale_cuda.cu").read_text()
ARCHS = "8.0,9.0"


def _spec(root: Path = KERNEL_DIR, **kw: object) -> jitops.OpSpec:
    return stable.spec(
        "stable_cuda_scale",
        root,
        ["scale_cuda.cu"],
        extra_cflags=kw.get("extra_cflags"),  # type: ignore[arg-type]
        extra_cuda_cflags=kw.get("extra_cuda_cflags"),  # type: ignore[arg-type]
        extra_ldflags=None,
        extra_include_paths=None,
        origin="tests",
    )


@pytest.fixture
def cuda_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans see a CUDA 13.0 torch without a GPU (what the CI leg's venv is), whatever torch runs
    here."""
    monkeypatch.setattr(jplan, "probe", lambda **kw: gpu_system(None))


def test_flags_are_the_targets_archs_and_the_stable_words(cuda_torch: None) -> None:
    plan = jplan.make_plan(_spec(), "cuda", ARCHS)
    assert plan.builder == "stable" and plan.target.name == "cuda-sm80-sm90"
    gencode = arch_gencode_flags(("8.0", "9.0"))
    assert [w for w in plan.cuda_cflags if w.startswith("-gencode")] == list(gencode)
    assert (
        set(STABLE_NVCC_FLAGS) <= set(plan.cuda_cflags)
        and "-DTORCH_STABLE_ONLY" in plan.cuda_cflags
    )
    # torch's C++-API nvcc flags never reach a stable build: its key holds no torch version to pin
    # them
    assert not any(w.startswith("-D__CUDA_NO_HALF") for w in plan.cuda_cflags)
    assert stable.version_flag((2, 13)) in plan.cflags
    # the same arch list however it is spelled: the same key
    assert jplan.make_plan(_spec(), "cuda", "9.0;8.0").key == plan.key
    assert jplan.make_plan(_spec(), "cuda", "9.0").key != plan.key


def test_the_key_holds_the_target_version_and_cudas_major_not_torchs(cuda_torch: None) -> None:
    spec = _spec()
    system = gpu_system(None)
    target = Target("cuda", system.cpu_capability, ("8.0", "9.0"))
    digests = {"scale_cuda.cu": "0" * 64}

    def key(sys_: object = system, spec_: jitops.OpSpec = spec) -> str:
        parts = ingredients(spec_, target, sys_, None, None, digests)  # type: ignore[arg-type]
        return compute_key(parts)

    ingr = ingredients(spec, target, system, None, None, digests)
    assert ingr["abi"] == "stable" and ingr["torch_version"] is None and ingr["torch_cuda"] == "13"
    assert key(dataclasses.replace(system, torch_version="2.99.0")) == key()  # a torch upgrade
    assert key(dataclasses.replace(system, torch_cuda="13.2")) == key()  # cudart's minor
    assert key(dataclasses.replace(system, torch_cuda="14.0")) != key()  # another cudart
    older = _spec(extra_cflags=[stable.version_flag((2, 12))])
    assert key(spec_=older) != key()
    assert key(spec_=_spec(extra_cuda_cflags=["-DFAST=1"])) != key()


def test_nvcc_command_and_link_words(tmp_path: Path) -> None:
    """nvcc gets the plan's CUDA flags and the library's macros (its target among them); a source
    whose path sh would act on reaches nvcc through a plain alias; the link takes cudart and
    torch_cuda only as needed (where torch has one)."""
    odd = tmp_path / "a $(x) b"
    odd.mkdir()
    (odd / "k.cu").write_text(KERNEL)
    (tmp_path / "build").mkdir()
    job = types.SimpleNamespace(
        library="k",
        device="cuda",
        target="cuda-sm80",
        namespace="jitops_k_0123",
        sources=(odd / "k.cu",),
        include_dirs=(odd,),
        cflags=("-O2", "-D", "LIB_NS=k_ns", stable.version_flag((2, 13)), "-fno-math-errno"),
        cuda_cflags=("-O3", *arch_gencode_flags(("8.0",)), *STABLE_NVCC_FLAGS),
        ldflags=(),
        cxx="c++",
        nvcc="/opt/cuda/bin/nvcc",
        env={},
        build_dir=tmp_path / "build",
    )
    compile_, link = stable.commands(job, tmp_path / "build" / "k.so")
    assert compile_[:3] == ["/opt/cuda/bin/nvcc", "-ccbin", "c++"]
    assert "-DLIB_NS=k_ns" in compile_ and stable.version_flag((2, 13)) in compile_
    assert "-O2" not in compile_ and "-fno-math-errno" not in compile_  # g++'s words stay g++'s
    assert (
        "-DJITOPS_NS=jitops_k_0123" in compile_
        and "-gencode=arch=compute_80,code=sm_80" in compile_
    )
    assert all("$(x)" not in w for w in compile_), compile_
    src = compile_[compile_.index("-c") + 1]
    assert (tmp_path / "build" / src).read_text() == KERNEL
    assert "-L/opt/cuda/lib64" in link and "-lcudart" in link
    has_cuda_lib = (Path(stable._torch_dirs()[1]) / "libtorch_cuda.so").exists()
    assert ("-ltorch_cuda" in link) == has_cuda_lib
    assert link.index("-Wl,--as-needed") < link.index("-lcudart")
    # the commands made again (a retry) find the aliases in place
    assert stable.commands(job, tmp_path / "build" / "k.so")[0] == compile_
    job.env = {"CC": "/usr/bin/gcc-12"}
    assert stable.commands(job, tmp_path / "build" / "k.so")[0][:3] == [
        "/opt/cuda/bin/nvcc",
        "-ccbin",
        "/usr/bin/gcc-12",
    ]
    # nvcc runs the host compiler and passes -D values through sh: what sh would act on is refused
    job.env = {"CC": "/opt/$(x)/gcc"}
    with pytest.raises(ConfigError, match="through sh"):
        stable.commands(job, tmp_path / "build" / "k.so")
    job.env, job.cflags = {}, (stable.version_flag((2, 13)), "-DNAME=`x`")
    with pytest.raises(ConfigError, match="nvcc would pass on to a shell"):
        stable.commands(job, tmp_path / "build" / "k.so")


def test_refusals_name_the_cause_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nvcc: a ToolchainError naming CUDA_HOME before any compile; a CUDA flag naming another
    target and schemas=: ArgumentError; a CUDA-only library on a CPU target: TargetError."""
    system = gpu_system(None, CUDA_HOME=str(tmp_path), TORCH_CUDA_ARCH_LIST="8.0")
    monkeypatch.setattr(jplan, "probe", lambda **kw: system)
    with pytest.raises(
        ToolchainError, match=r"no usable nvcc .*CUDA_HOME.*Fix: install the CUDA toolkit"
    ):
        jitops.load_inline("stable_cuda_nonvcc", "", cuda_sources=KERNEL, device="cuda")
    with pytest.raises(ArgumentError, match="extra_cuda_cflags holds .* in extra_cflags only"):
        jitops.load_inline(
            "stable_cuda_two",
            "",
            cuda_sources=KERNEL,
            extra_cuda_cflags=[stable.version_flag((2, 14))],
        )
    # the same target word in both (as torch's loader takes sources' flags) is one target
    _spec(
        extra_cflags=[stable.version_flag((2, 13))],
        extra_cuda_cflags=[stable.version_flag((2, 13))],
    )
    with pytest.raises(ArgumentError, match="takes no schemas="):
        jitops.load_inline(
            "stable_cuda_schemas", "", cuda_sources=KERNEL, schemas=["scale(Tensor x) -> Tensor"]
        )
    monkeypatch.undo()
    with pytest.raises(TargetError, match="only CUDA sources.*Fix: device='cuda'"):
        jitops.load_inline("stable_cuda_on_cpu", "", cuda_sources=KERNEL, device="cpu")


def _nvcc() -> str | None:
    home = Path("/usr/local/cuda")
    nvcc = shutil.which("nvcc") or (
        str(home / "bin" / "nvcc") if (home / "bin" / "nvcc").exists() else None
    )
    return nvcc


def _cuobjdump(nvcc: str) -> str | None:
    import importlib.util

    found = importlib.util.find_spec("triton")
    if found is not None and found.submodule_search_locations:
        path = Path(list(found.submodule_search_locations)[0]) / "backends/nvidia/bin/cuobjdump"
        if path.exists():
            return str(path)
    beside = Path(nvcc).resolve().parent / "cuobjdump"
    return str(beside) if beside.exists() else shutil.which("cuobjdump")


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_a_real_nvcc_build_for_two_archs(
    cuda_torch: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compile and link with the real nvcc for sm_80 and sm_90 (no GPU needed): the library depends
    on torch's C shim library and cudart only, imports torch only through the C shim, and holds
    exactly that SASS."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc (the CUDA toolkit; CUDA CI leg: .ci/cuda-leg.sh)")
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    plan = jplan.make_plan(_spec(), "cuda", ARCHS)
    if plan.toolchain_error is not None:
        pytest.skip(f"this nvcc cannot build for CUDA 13 here: {plan.toolchain_error}")
    start = time.monotonic()
    built = entry.ensure_entry(plan)
    print(f"cold stable CUDA build for {ARCHS}: {time.monotonic() - start:.1f} s")
    lib = built.path / built.manifest.library_file
    log = built.manifest.build_log
    assert "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90" in log
    readelf = shutil.which("readelf")
    if readelf is not None:
        dynamic = subprocess.run(
            [readelf, "-d", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        needed = {
            line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line
        }
        torch_libs = {n for n in needed if "torch" in n or "c10" in n}
        assert torch_libs == {f"lib{stable.SHIM_LIBRARY}.so"}, needed
        assert any(n.startswith("libcudart.so") for n in needed), needed
    nm = shutil.which("nm")
    if nm is not None:
        out = subprocess.run(
            [nm, "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True
        )
        names = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
        unversioned = [
            n for n in names if "@" not in n and not n.startswith(("_ITM_", "__gmon_start__"))
        ]
        assert unversioned and all(n.startswith(("aoti_torch_", "torch_")) for n in unversioned), (
            unversioned
        )
    cuobjdump = _cuobjdump(nvcc)
    if cuobjdump is not None:
        elf = subprocess.run(
            [cuobjdump, "--list-elf", str(lib)], capture_output=True, text=True
        ).stdout
        assert sorted(w.split(".")[-2] for w in elf.split() if w.endswith(".cubin")) == [
            "sm_80",
            "sm_90",
        ]


@pytest.mark.cuda
@pytest.mark.compile
def test_the_kernel_runs_on_the_gpu_as_torch_does() -> None:
    """Built for this GPU, registered for CUDA only; matches x * s (non-contiguous and empty inputs
    too) on a side stream and a second device where there is one; a CPU tensor finds no kernel."""
    lib = jitops.load("stable_cuda_scale", [str(KERNEL_DIR / "scale_cuda.cu")], device="cuda")
    ns = lib.library.namespace
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(f"{ns}::scale", "CUDA") and not has(f"{ns}::scale", "CPU")
    for x in (
        torch.randn(1000, device="cuda"),
        torch.randn(64, 33, device="cuda").t(),
        torch.empty(0, device="cuda"),
        torch.randn(1, device="cuda"),
    ):
        torch.testing.assert_close(lib.scale(x, 1.5), x * 1.5)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(1 << 20, device="cuda")
        y = lib.scale(x, -2.0)
    side.synchronize()
    torch.testing.assert_close(y, x * -2.0)
    if torch.cuda.device_count() > 1:
        x = torch.randn(4096, device="cuda:1")
        torch.testing.assert_close(lib.scale(x, 3.0), x * 3.0)
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        lib.scale(torch.ones(3), 2.0)
