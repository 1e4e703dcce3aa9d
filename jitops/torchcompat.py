"""Which torch versions jitops supports, and the differences between them that it bridges.

Tested: 2.13.0 (CI's main job), 2.14.1 and 2.15.0 (``.ci/torch-versions.sh``).
Outside ``SUPPORTED`` jitops warns once and goes on. torch 2.7.1 was tried: the
ops build and load with the two bridges below, but numerics and torch.compile
tests fail there, so it is outside the range.

Bridged here:

- torch 2.7's ninja writer adds TORCH_CUDA_ARCH_LIST's arch flags even when jitops gave its own
  (``write_ninja_file`` silences that helper while it writes).
- ``cpp_extension``'s private ninja-file helpers gained SYCL parameters
  (``_prepare_ldflags(..., with_sycl, ...)`` in 2.10-ish,
  ``_write_ninja_file_to_build_library(..., extra_sycl_cflags, ..., with_sycl,
  ...)`` in 2.7). They are called here by parameter name, so each torch gets
  the arguments its own signature asks for.

May import: nothing of jitops (torch only at call time).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Sequence
from typing import Any

SUPPORTED = ((2, 13), (2, 15))  # oldest and newest minor tested; pyproject says torch>=2.13,<2.16
_warned: set[str] = set()


def parse(version: str) -> tuple[int, int] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; None for what is not a release number."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_version(version: str) -> bool:
    """Warn once (RuntimeWarning) when ``version`` is outside the tested range. True when inside."""
    have = parse(version)
    lo, hi = SUPPORTED
    if have is not None and lo <= have <= hi:
        return True
    if version not in _warned:
        _warned.add(version)
        what = "newer than" if have is not None and have > hi else "older than" if have is not None else "not"
        warnings.warn(
            f"jitops: torch {version} is {what} the versions jitops is tested with "
            f"({lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}); builds may fail or misbehave. Fix: install a torch in that "
            f"range (e.g. pip install 'torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}'), or upgrade jitops",
            RuntimeWarning,
            stacklevel=4,
        )
    return False


def _call_by_name(fn: Any, values: dict[str, Any]) -> Any:
    """Call ``fn`` with the entries of ``values`` its signature names (others default to False/[])."""
    args = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in values:
            args.append(values[name])
        elif name.startswith("extra_"):
            args.append([])
        elif name.startswith(("with_", "is_")) or name == "verbose":
            args.append(False)
        elif p.default is not inspect.Parameter.empty:
            args.append(p.default)
        else:
            raise TypeError(f"torch.utils.cpp_extension.{fn.__name__} has an unknown parameter {name!r}")
    return fn(*args)


def prepare_ldflags(ce: Any, ldflags: Sequence[str], with_cuda: bool) -> list[str]:
    return list(_call_by_name(ce._prepare_ldflags, {"extra_ldflags": list(ldflags), "with_cuda": with_cuda}))


def write_ninja_file(ce: Any, path: str, name: str, sources: list[str], cflags: list[str], cuda_cflags: list[str],
                     ldflags: list[str], include_dirs: list[str], with_cuda: bool) -> None:
    """cpp_extension writes ``path``; for CUDA, with jitops's -gencode flags (in ``cuda_cflags``) only.

    torch >= 2.10-ish skips its own arch flags when the extra CUDA flags hold some; older torch (2.7)
    always added TORCH_CUDA_ARCH_LIST's (or every arch), so its arch helper is silenced while it writes.
    The caller holds build.py's CUDA lock, so no other thread writes a ninja file meanwhile.
    """
    values = {"path": path, "name": name, "sources": sources, "extra_cflags": cflags, "extra_cuda_cflags": cuda_cflags,
              "extra_ldflags": ldflags, "extra_include_paths": include_dirs, "with_cuda": with_cuda}
    if not with_cuda:
        _call_by_name(ce._write_ninja_file_to_build_library, values)
        return
    saved = ce._get_cuda_arch_flags
    ce._get_cuda_arch_flags = lambda cflags=None: []  # jitops decided (and keyed) the archs
    try:
        _call_by_name(ce._write_ninja_file_to_build_library, values)
    finally:
        ce._get_cuda_arch_flags = saved
