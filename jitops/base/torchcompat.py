"""Which torch versions jitops supports (a warning outside them).

Tested: 2.13.0 (CI's main job), 2.14.1 and 2.15.0 (``.ci/torch-versions.sh``).
Outside ``SUPPORTED`` jitops warns once and goes on. torch 2.7.1 was tried: the
ops built and loaded with two cpp_extension bridges (no longer needed), but numerics and torch.compile
tests fail there, so it is outside the range.

torch's build details differ between these versions, but jitops writes its own
build.ninja (:mod:`jitops.ninja`) from cpp_extension's public helpers
(``include_paths``, ``library_paths``, ``COMMON_NVCC_FLAGS``, ``CUDNN_HOME``),
whose signatures are the same across the range (tests/test_torch_versions.py),
so nothing needs bridging: this module only states the range and warns outside it.

Imports: nothing of jitops.
"""

from __future__ import annotations

import warnings

SUPPORTED = ((2, 13), (2, 15))  # oldest and newest minor tested; pyproject says torch>=2.13,<2.16
_warned: set[str] = set()


def parse(version: str) -> tuple[int, int] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; None for what is not a release number."""
    major, _, rest = version.partition(".")
    # the digits after the first dot ("13" of "13.0+cpu")
    minor = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    ok = major.isascii() and major.isdigit() and minor != ""
    # (no regex: compiling one is most of a warm import's cost)
    return (int(major), int(minor)) if ok else None


def check_version(version: str) -> bool:
    """Warn once (RuntimeWarning) when ``version`` is outside the tested range. True when inside."""
    have = parse(version)
    lo, hi = SUPPORTED
    if have is not None and lo <= have <= hi:
        return True
    if version not in _warned:
        _warned.add(version)
        what = (
            "newer than"
            if have is not None and have > hi
            else "older than"
            if have is not None
            else "not"
        )
        warnings.warn(
            f"jitops: torch {version} is {what} the versions jitops is tested with "
            f"({lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}); builds may fail or misbehave. Fix: install a torch in that "
            f"range (e.g. pip install 'torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}'), or upgrade jitops",
            RuntimeWarning,
            stacklevel=4,
        )
    return False
