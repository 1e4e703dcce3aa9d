"""jitops's ninja writer gives the compile and link commands torch's writer gave (pure: no compiler runs).

The reference is what jitops did before it had a writer of its own: torch's
private ``_write_ninja_file_to_build_library`` with cpp_extension's
``CUDA_HOME`` pointed at the chosen toolkit, the compilers pinned, and the
registration files' flags. It lives here, in the test, and nowhere else.
``ninja -t commands`` expands both files, so the comparison is of the exact
command lines ninja would run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from jitops.build import ninja
from jitops.target import toolchain
from jitops.target.archs import arch_gencode_flags
from jitops.build.job import LINK_DEPFILE, BuildJob
from jitops.registry import registry
from jitops.target import choose_target, probe
from tests.cuda_fakes import fake_toolkit


def _torch_written(job: BuildJob) -> Path:
    import torch.utils.cpp_extension as ce

    with_cuda = job.device == "cuda"
    path = job.build_dir / "build.ninja"
    libs = [f for d in ninja.cuda_library_includes() for f in ("-isystem", d)] if with_cuda else []
    cflags = [*job.cflags, f"-DJITOPS_NS={job.namespace}"] + (
        ["-DJITOPS_WITH_CUDA", *libs] if with_cuda else []
    )
    cuda_cflags = (
        [*job.cuda_cflags, f"-DJITOPS_NS={job.namespace}", "-DJITOPS_WITH_CUDA", *libs]
        if with_cuda
        else []
    )
    saved = ce.CUDA_HOME
    if with_cuda and job.nvcc:
        ce.CUDA_HOME = os.path.dirname(os.path.dirname(job.nvcc))
    try:
        ldflags = ce._prepare_ldflags(list(job.ldflags), with_cuda, False, False, False)
        ldflags.remove("-ltorch_python")
        ce._write_ninja_file_to_build_library(
            str(path),
            job.library,
            [str(s) for s in job.sources],
            cflags,
            cuda_cflags,
            [],
            ldflags,
            [str(d) for d in job.include_dirs],
            with_cuda,
            False,
            False,
        )
    finally:
        ce.CUDA_HOME = saved
    out, cflags_line = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("cxx = "):
            line = "cxx = " + ninja.escape_path(job.cxx)
        elif line.startswith("nvcc = ") and job.nvcc:
            line = "nvcc = " + ninja.escape_path(job.nvcc)
        elif line.startswith("cflags = "):
            cflags_line = line
        out.append(line)
        if (
            line.startswith("build ")
            and ": compile " in line
            and os.path.basename(line).startswith("register")
        ):
            out.append("  cflags = " + ninja.registration_cflags(cflags_line[len("cflags = ") :]))
    path.write_text("\n".join(out) + "\n")
    return path


def _commands(build_dir: Path) -> list[str]:
    exe = toolchain.find_ninja("test")
    proc = subprocess.run(
        [exe, "-t", "commands"], cwd=build_dir, capture_output=True, text=True, check=True
    )
    return proc.stdout.splitlines()


def _job(tmp_path: Path, name: str, device: str, nvcc: str | None) -> BuildJob:
    spec = registry().library("softmax")
    system = probe()
    target = choose_target(system, "cpu")
    (tmp_path / name).mkdir()
    gencode = arch_gencode_flags(("8.0", "9.0+PTX")) if device == "cuda" else ()
    return BuildJob(
        library="softmax",
        target="t",
        device=device,
        namespace="jitops_softmax_0123456789abcdef",
        sources=tuple(spec.root / s for s in spec.sources_for(device)),
        include_dirs=(Path(__file__).parent.parent / "jitops" / "include", spec.root),
        cflags=(*target.cflags(), "-DX=1"),
        cuda_cflags=("-O3", *gencode),
        ldflags=("-fopenmp",),
        cxx="/usr/bin/c++",
        ninja="ninja",
        nvcc=nvcc,
        build_dir=tmp_path / name,
        env={},
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_same_commands_as_torchs_writer(
    tmp_path: Path, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CC", raising=False)
    nvcc = (
        str(fake_toolkit(tmp_path / "cuda-13.0", "13.0") / "bin" / "nvcc")
        if device == "cuda"
        else None
    )
    theirs = _torch_written(_job(tmp_path, "torch", device, nvcc))
    ours, aliases = ninja.write_ninja_file(_job(tmp_path, "jitops", device, nvcc))
    assert aliases == {}  # plain paths are used as they are
    expected = _commands(theirs.parent)
    # the two deliberate differences: every file read (-MD, not -MMD) and the linker's list of the
    # files it read, which an entry records (store.inputs)
    link_deps = f" -Wl,--dependency-file={LINK_DEPFILE.format(out='softmax.so')}"
    mine = [
        c.replace(link_deps, "")
        if "nvcc" in c
        else c.replace(" -MD ", " -MMD ").replace(link_deps, "")
        for c in _commands(ours.parent)
    ]
    assert expected and mine == expected
    assert all(" -MD " in c or link_deps in c for c in _commands(ours.parent) if "nvcc" not in c)
    assert any("-lc10_cuda" in c for c in expected) == (device == "cuda")


def test_paths_sh_would_act_on_never_reach_nvcc(tmp_path: Path) -> None:
    """A source folder whose path holds `$(...)`, backticks, quotes, `;` and spaces: nvcc sees a plain
    symlink name, the host compiler the quoted real path, and the log is rewritten back."""
    odd = tmp_path / "c $(touch MARK) `touch MARK2` ; 'q' \"d\" ü"
    odd.mkdir()
    (odd / "k.cu").write_text("// k\n")
    (odd / "register.cpp").write_text("// r\n")
    kit = fake_toolkit(tmp_path / "cuda", "13.0")
    (tmp_path / "b").mkdir()
    job = BuildJob(
        library="odd",
        target="t",
        device="cuda",
        namespace="jitops_odd_0",
        sources=(odd / "k.cu", odd / "register.cpp"),
        include_dirs=(odd,),
        cflags=(),
        cuda_cflags=tuple(arch_gencode_flags(("8.0",))),
        ldflags=(),
        cxx="/usr/bin/c++",
        ninja="ninja",
        nvcc=str(kit / "bin" / "nvcc"),
        build_dir=tmp_path / "b",
        env={},
    )
    path, aliases = ninja.write_ninja_file(job)
    assert (
        set(aliases.values()) == {str(odd)} and (tmp_path / "b" / "_jitops_path0").resolve() == odd
    )
    assert (
        tmp_path / "b" / "_jitops_src1" / "k.cu"
    ).read_text() == "// k\n"  # nvcc resolves symlinks: a copy
    commands = _commands(path.parent)
    nvcc_lines = [c for c in commands if c.startswith(str(kit))]
    assert nvcc_lines and all(str(odd) not in c and "MARK" not in c for c in nvcc_lines)
    host = next(c for c in commands if c.startswith("/usr/bin/c++") and "register.cpp" in c)
    assert f"-I'{odd}'" in host.replace("'\"'\"'", "'")  # quoted for the shell ninja runs
    assert ninja.unalias("_jitops_src1/k.cu(1): error: x", aliases) == f"{odd}/k.cu(1): error: x"
