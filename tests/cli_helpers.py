"""Helpers for the CLI tests: small fake-built specs, stripped PATHs, the jitops command as a child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jitops.spec import OpSpec

from tests.helpers import REPO, child_env


def fake_spec(root: Path, name: str) -> OpSpec:
    """A one-source library for the fake builder (its kernels would come from Python)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "k.cpp").write_text(f"// {name}\n")
    return OpSpec(
        name=name, root=folder, cpu_sources=("k.cpp",), schemas=(f"{name}(Tensor x) -> Tensor",)
    )


def stripped_path(tmp: Path) -> str:
    """A PATH holding only python: no c++, g++, gcc, cc, nvcc."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(sys.executable)
    return str(bin_dir)


def no_compiler_env(tmp: Path, **overrides: str | None) -> dict[str, str]:
    return child_env(PATH=stripped_path(tmp), CXX=None, CC=None, CUDA_HOME=None, **overrides)


def run_child(
    env: dict[str, str], *, timeout: float = 240, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m jitops args`` in a fresh interpreter (audited children are tests/scenarios_cli.py)."""
    return subprocess.run(
        [sys.executable, "-m", "jitops", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
