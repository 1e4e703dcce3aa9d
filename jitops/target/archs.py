"""CUDA arch lists: parsing, nvcc flags, and whether a build runs on a device.

All pure functions over strings and tuples, so every GPU case is unit-tested
on a machine without one. An arch is written as in ``TORCH_CUDA_ARCH_LIST``:
``"8.0"`` (SASS for sm_80), ``"9.0a"`` (arch-specific SASS, runs only on
9.0), ``"10.0f"`` (family SASS), and a ``+PTX`` suffix adds PTX for that
arch, which the driver JIT-compiles for newer devices.

Imports: checks (``shown``), errors. Imported only for a CUDA target (lazily by target and plan).
"""

from __future__ import annotations

import re

from ..spec.checks import shown
from ..errors import TargetError

# torch 2.14.1's cpp_extension._get_cuda_arch_flags names, with the same
# expansions (torch replaces these substrings; jitops matches whole entries,
# case-insensitively, and also takes ',' as a separator).
NAMED_ARCHS: dict[str, str] = {
    "Kepler+Tesla": "3.7",
    "Kepler": "3.5+PTX",
    "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX",
    "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX",
    "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX",
    "Ada": "8.9+PTX",
    "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX",
    "Rubin": "10.7+PTX",
}
_BY_LOWER = {k.lower(): v for k, v in NAMED_ARCHS.items()}
_ARCH_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+ptx)?$", re.IGNORECASE)
_SM_RE = re.compile(r"^sm_(\d+)(\d)[af]?$")  # "sm_120" -> 12, 0


def _split(arch: str) -> tuple[int, int, str, bool]:
    """``"9.0a+PTX"`` -> ``(9, 0, "a", True)``."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise TargetError(f"invalid CUDA arch {shown(arch)}")
    return int(m.group(1)), int(m.group(2)), m.group(3).lower(), bool(m.group(4))


def parse_arch_list(text: str) -> tuple[str, ...]:
    """Parse a ``TORCH_CUDA_ARCH_LIST``-style string into normalized entries.

    Separators are ``;``, ``,`` or whitespace. Entries are ``8.0``, ``9.0a``,
    ``10.0f``, any of them with ``+PTX``, or a name torch accepts
    (``Ampere`` -> ``8.0;8.6+PTX``). The result is sorted and deduplicated,
    and ``8.0`` next to ``8.0+PTX`` collapses to ``8.0+PTX``, so equivalent
    spellings give the same key and the same entry name.
    """
    ptx: dict[tuple[int, int, str], bool] = {}
    for raw in re.split(r"[;,\s]+", text.strip()):
        if not raw:
            continue
        expanded = _BY_LOWER.get(raw.lower())
        if expanded is None and raw.lower().endswith("+ptx") and raw[:-4].lower() in _BY_LOWER:
            named = _BY_LOWER[raw[:-4].lower()].split(";")
            expanded = ";".join(named[:-1] + [named[-1].removesuffix("+PTX") + "+PTX"])
        for arch in expanded.split(";") if expanded else [raw]:
            if not _ARCH_RE.match(arch):
                raise TargetError(
                    f"invalid CUDA arch {shown(raw)} in {shown(text)}: expected entries like '8.0', '9.0a', '8.6+PTX', "
                    f"or one of the names torch accepts ({', '.join(NAMED_ARCHS)}), separated by ';' or ','"
                )
            major, minor, suffix, has_ptx = _split(arch)
            ptx[(major, minor, suffix)] = ptx.get((major, minor, suffix), False) or has_ptx
    if not ptx:
        raise TargetError(
            f"empty CUDA arch list {shown(text)}: name at least one arch, e.g. '8.0,9.0'"
        )
    return tuple(f"{ma}.{mi}{s}{'+PTX' if ptx[(ma, mi, s)] else ''}" for ma, mi, s in sorted(ptx))


def default_arch(capability: tuple[int, int], torch_sm: tuple[str, ...] = ()) -> str:
    """The arch to build for a device of ``capability`` when none is named.

    That device's own arch, unless it is newer than every ``sm_XY`` this torch
    was built for (``torch_sm``, from ``torch.cuda.get_arch_list()``): then
    nvcc (which must match torch's CUDA) may not know it, so, like
    cpp_extension, build the newest arch torch has, with PTX the driver
    JIT-compiles for the device.
    """
    known = [(int(m.group(1)), int(m.group(2))) for m in map(_SM_RE.match, torch_sm) if m]
    newest = max(known, default=None)
    if newest is None or capability <= newest:
        return f"{capability[0]}.{capability[1]}"
    return f"{newest[0]}.{newest[1]}+PTX"


def _num(arch: str) -> str:
    major, minor, suffix, _ = _split(arch)
    return f"{major}{minor}{suffix}"


def arch_gencode_flags(archs: tuple[str, ...]) -> tuple[str, ...]:
    """The nvcc ``-gencode`` flags for ``archs``: SASS for each, PTX where ``+PTX``."""
    flags = []
    for a in archs:
        num = _num(a)
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if _split(a)[3]:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return tuple(flags)


def sass_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    """``("8.0", "9.0a+PTX")`` -> ``("sm_80", "sm_90a")``: what ``cuobjdump --list-elf`` should list."""
    return tuple(f"sm_{_num(a)}" for a in archs)


def ptx_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    """``("8.0", "9.0+PTX")`` -> ``("compute_90",)``: what ``cuobjdump --list-ptx`` should list."""
    return tuple(f"compute_{_num(a)}" for a in archs if _split(a)[3])


def _serves(major: int, minor: int, suffix: str, device: tuple[int, int], *, ptx: bool) -> bool:
    if suffix == "a":  # arch-specific: that exact device only
        return (major, minor) == device
    if suffix == "f" or not ptx:  # SASS (and family code) runs on later minors of the same major
        return major == device[0] and minor <= device[1]
    return (major, minor) <= device  # PTX: the driver compiles it for any later device


def runnable_code(archs: tuple[str, ...], capability: tuple[int, int]) -> str | None:
    """The code in a build for ``archs`` that a device of ``capability`` runs, else None.

    SASS is preferred (``"sm_86"``); else PTX the driver can JIT-compile
    (``"compute_80"``). SASS for X.y runs on X.z with z >= y; PTX for X.y on
    any device >= X.y; ``a`` code only on exactly that device.
    """
    parsed = sorted((_split(a) for a in archs), reverse=True)
    for major, minor, suffix, _ in parsed:
        if _serves(major, minor, suffix, capability, ptx=False):
            return f"sm_{major}{minor}{suffix}"
    for major, minor, suffix, has_ptx in parsed:
        if has_ptx and _serves(major, minor, suffix, capability, ptx=True):
            return f"compute_{major}{minor}{suffix}"
    return None


def check_runnable(archs: tuple[str, ...], capability: tuple[int, int], what: str) -> str:
    """:func:`runnable_code`, or a TargetError that explains the mismatch and its fixes.

    Raised instead of CUDA's "no kernel image is available for execution on
    the device" at the first launch.
    """
    code = runnable_code(archs, capability)
    if code is not None:
        return code
    dev = f"{capability[0]}.{capability[1]}"
    ptx = ", ".join(ptx_archs(archs)) or "none"
    raise TargetError(
        f"{what} cannot run on this GPU (compute capability {dev}): it holds SASS for "
        f"{', '.join(sass_archs(archs))} and PTX for {ptx}, and none of it runs on sm_{dev.replace('.', '')} "
        f"(launching would fail with 'no kernel image is available'). Fix: include {dev} in the arch list "
        f"(e.g. TORCH_CUDA_ARCH_LIST='{dev}' or `jitops warm --device cuda --arch {dev}`), or unset "
        "TORCH_CUDA_ARCH_LIST to build for the current GPU"
    )
