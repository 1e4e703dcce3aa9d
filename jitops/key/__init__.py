"""Subpackage ``jitops.key`` (stage 7), one module: what a key holds. Public names: ``compute_key``,
``ingredients``, ``namespace_for``, ``env_vars_for``, ``flag_words``, ``source_state`` / ``changed_source``,
``TORCH_STYLE_FLAG`` / ``STABLE_ABI_FLAG`` (spec's), ``STABLE_BUILDER``, ``KEY_CHARS``. May import: ``jitops.target`` and the stages
below it (registry, kernels, spec, base, errors, _version).

The cache key: ingredients, source digests, ``compute_key``, the namespace, and
the environment-variable policy (which variables a key holds, which are scrubbed).

Pure functions of values handed in, plus the hashing of source files. A key holds exactly what changes its binary:
a variable that only matters to nvcc or to cpp_extension's CUDA paths is in CUDA keys only, so setting
``TORCH_CUDA_ARCH_LIST`` never rebuilds a CPU op.

Imports: errors, fsutil, spec, checks (``shown``, ``shell_words``, ``LINE_BREAK``, ``NVCC_UNSAFE``), target (the variables the
probe records; System, Target for annotations), compilers (the compiler's ingredient), toolchain (Tool, for
annotations). The key sits above target: what a build targets is probed first, then keyed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import fsutil
from ..spec.checks import LINE_BREAK, NVCC_UNSAFE, shell_words, shown
from ..errors import ConfigError
from ..spec import HEADER_SUFFIXES, SOURCE_SUFFIXES, STABLE_ABI_FLAG, OpSpec
from ..target import BUILD_ENV_VARS, HOST_ENV_VARS
from ..target.compilers import compiler_ingredient

if TYPE_CHECKING:
    from ..target import System, Target
    from ..target.toolchain import Tool

# In a spec's cflags: its sources are written for torch.utils.cpp_extension
# (cpp_ext_style.NAME_FLAGS).
TORCH_STYLE_FLAG = "-DTORCH_EXTENSION_NAME=JITOPS_NS"
# STABLE_ABI_FLAG (spec) in a spec's cflags: sources on torch's stable C ABI (stable.py); the key
# holds their -DTORCH_TARGET_VERSION, not torch's. build/stable.py's builder, which plans of such
# specs carry (keyed as env.JITOPS_BUILDER)
STABLE_BUILDER = "stable"
STABLE_CFLAGS = ("-O2", "-std=c++17", "-fvisibility=hidden", "-fno-math-errno")
# nvcc's part of a stable CUDA build, after the target's -O3, -lineinfo and -gencode flags: jitops's
# own words, never torch's COMMON_NVCC_FLAGS, since a stable key holds no torch version that would
# pin them. -DTORCH_STABLE_ONLY as torch's own stable extensions pass it.
STABLE_NVCC_FLAGS = (
    "-std=c++17",
    "-DTORCH_STABLE_ONLY",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
)
KEY_CHARS = 32  # 128 bits of sha256 in paths
INCLUDE_DIR = Path(__file__).parent.parent / "include"

# ------------------------------------------------------------------ env policy

# Where a non-real builder (Settings.builder, the test seam) appears in the key's "env".
BUILDER_INGREDIENT = "JITOPS_BUILDER"
# Removed from the build's environment instead, so they cannot change a binary behind the key's
# back.
SCRUBBED_ENV_VARS = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES",
    "NVCC_CCBIN",
    "TORCH_NVCC_FLAGS",
    "PYTORCH_NVCC",
    "CCACHE_DISABLE",
    "CCACHE_PREFIX",
    "OBJC_INCLUDE_PATH",
    "LD_RUN_PATH",
    "SOURCE_DATE_EPOCH",
)


def env_vars_for(device: str) -> tuple[str, ...]:
    """The variables whose values belong in the key of a build for ``device``."""
    return BUILD_ENV_VARS if device == "cuda" else HOST_ENV_VARS


def key_env(
    build_env: tuple[tuple[str, str], ...], device: str, builder: str = "real"
) -> dict[str, str]:
    """The part of a probed build environment that the key of a ``device`` build holds, plus a
    builder other than the real one (from Settings, never from the environment)."""
    wanted = env_vars_for(device)
    env = {k: v for k, v in build_env if k in wanted}
    if builder != "real":
        env[BUILDER_INGREDIENT] = builder
    return env


def split_flags(var: str, value: str) -> tuple[str, ...]:
    """A flag variable (``CXXFLAGS``, ``LDFLAGS``, ...) split as a shell would; ConfigError if it cannot be."""
    try:
        words = tuple(shell_words(value))
    except ValueError as e:
        raise ConfigError(
            f"{var}={shown(value)} cannot be split into compiler flags ({str(e).lower()}). "
            f"Fix: balance its quotes (e.g. {var}='-O2 -DNAME=\"x\"'), or unset {var}"
        ) from None
    if any(LINE_BREAK.search(w) for w in words):
        raise ConfigError(
            f"{var}={shown(value)} holds a line break inside quotes, which no compiler flag needs and "
            f"a build file cannot carry. Fix: remove it from {var}"
        )
    return words


def flag_words(items: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Flag strings split once into the words a shell makes of them, quotes honoured: ``"-O0 -Wall"`` is two
    flags, ``-DNAME="a b"`` one (``-DNAME=a b``). Each word then reaches the compiler as one argument."""
    return tuple(w for item in items for w in split_flags(what, item))


def check_nvcc_words(words: tuple[str, ...], what: str) -> None:
    """ConfigError for a word nvcc would hand to sh unquoted (see NVCC_UNSAFE)."""
    for w in (w for w in words if NVCC_UNSAFE.search(w)):
        raise ConfigError(
            f"{what} holds the flag {shown(w)}, which nvcc would pass on to a shell, where $, `, ;, &, |, "
            "<, > or a line break act. Fix: leave those out of CUDA flags (define such values in a header)"
        )


def extra_env_flags(system: System, device: str = "cpu") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """CFLAGS + CXXFLAGS and LDFLAGS from the environment, as argv lists.

    g++ does not read these itself, so jitops applies them (they are in the
    key). NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS are read by nvcc directly;
    for a CUDA build they are only checked here. A value that cannot be
    split (an unbalanced quote) is a ConfigError naming the variable.
    """

    def flags(var: str) -> tuple[str, ...]:
        return split_flags(var, system.env(var) or "")

    if device == "cuda":
        # nvcc reads these itself (-ccbin: CC)
        for var in (
            "NVCC_PREPEND_FLAGS",
            "NVCC_APPEND_FLAGS",
            "CC",
        ):
            check_nvcc_words(flags(var), var)
    return flags("CFLAGS") + flags("CXXFLAGS"), flags("LDFLAGS")


# ------------------------------------------------------------------ sources


def _files_under(root: Path) -> list[Path]:
    return fsutil.files_under(root, SOURCE_SUFFIXES + HEADER_SUFFIXES)


def source_files(spec: OpSpec, *, ours: bool = False) -> list[tuple[str, Path]]:
    """(label, path) of every source and header under the op's folder and include dirs (``ours``: and jitops's headers,
    as :func:`source_state` digests them)."""
    out = [(p.relative_to(spec.root).as_posix(), p) for p in _files_under(spec.root)]
    for i, d in enumerate(spec.include_dirs):
        out.extend((f"<include{i}>/{p.relative_to(d).as_posix()}", p) for p in _files_under(d))
    return out + (
        [
            (f"<jitops>/{p.relative_to(INCLUDE_DIR).as_posix()}", p)
            for p in _files_under(INCLUDE_DIR)
        ]
        if ours
        else []
    )


def source_stamp(spec: OpSpec) -> tuple[tuple[str, int, int], ...]:
    """(label, mtime_ns, size) of :func:`source_files`: a cheap "was anything edited?" check."""
    stamp = []
    for label, p in source_files(spec):
        try:
            st = p.stat()
        except OSError:
            continue
        stamp.append((label, st.st_mtime_ns, st.st_size))
    return tuple(stamp)


# (inode, ctime_ns, mtime_ns, size), taken before the bytes are read
Stamp = tuple[int, int, int, int]


def source_state(spec: OpSpec) -> tuple[dict[str, str], dict[str, Stamp]]:
    """sha256 of every source and header shipped with the op, by relative path; and each file's stamp.

    Covers the op's folder, its include dirs and jitops's own headers. Paths
    are relative, so the install prefix does not reach the key. The stamps
    are not in the key: :func:`changed_source` compares them after a build.
    """
    files = source_files(spec, ours=True)
    digests: dict[str, str] = {}
    stamps: dict[str, Stamp] = {}
    for label, p in files:
        st = p.stat()  # before the read: an edit in between shows in the stamp
        stamps[label] = (st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
        digests[label] = fsutil.sha256_file(p)
    for rel in spec.cpu_sources + spec.cuda_sources:
        if rel not in digests:
            raise FileNotFoundError(f"op {spec.name!r}: source {rel!r} not found under {spec.root}")
    return digests, stamps


def changed_source(
    spec: OpSpec, digests: Mapping[str, str], stamps: Mapping[str, Stamp]
) -> str | None:
    """After a build: None if every file the key covers still holds the bytes it was digested with, else which
    changed: its bytes, its inode or ctime (written again: the compiler may have read other bytes meanwhile), added, removed."""
    try:
        now, now_stamps = source_state(spec)
    except OSError as e:
        return f"a source could not be read again ({e})"
    for label in sorted(set(now) | set(digests)):
        if label not in now or label not in digests:
            return f"{label} was {'added' if label in now else 'removed'}"
        if now[label] != digests[label]:
            return f"{label} was edited"
        if stamps and now_stamps[label][:3] != stamps.get(label, now_stamps[label])[:3]:
            return f"{label} was written again"
    return None


# ------------------------------------------------------------------ the key


def build_flags(
    spec: OpSpec, target: Target, system: System
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(cflags, cuda_cflags, ldflags) of one build: the target's, the spec's, then the environment's."""
    env_cflags, env_ldflags = extra_env_flags(system, target.device)
    what = f"library {spec.name!r}"
    stable = STABLE_ABI_FLAG in spec.cflags
    cuda: tuple[str, ...] = ()
    if target.device == "cuda":
        cuda = (
            *target.cuda_cflags(),
            *(STABLE_NVCC_FLAGS if stable else ()),
            *flag_words(spec.cuda_cflags, f"{what}'s CUDA flag"),
        )
        check_nvcc_words(cuda, f"the CUDA flags of {what}")
    # Sources written for torch.utils.cpp_extension (the drop-in) get torch's C++ flags only:
    # jitops's -O3, ISA flags (-mfma contracts a*b+c), -fno-math-errno or -DCPU_CAPABILITY_* would
    # change their code and results. On the stable C ABI: no OpenMP; a user's kernel gets no ISA
    # flags either (-mfma would let the compiler fuse its a*b+c), a builtin one (nms) the target's,
    # as its ATen build does (its cflags forbid contraction).
    if TORCH_STYLE_FLAG in spec.cflags:
        own: tuple[str, ...] = ()
    # the target's -O3 and ISA flags replace the stable path's -O2, once each
    elif stable and spec.origin == "builtin":
        isa = target.isa_cflags()
        own = (*(f for f in STABLE_CFLAGS if not f.startswith("-O") and f not in isa), *isa)
    elif stable:
        own = STABLE_CFLAGS
    else:
        own = target.cflags()
    return (
        (*own, *flag_words(spec.cflags, f"{what}'s flag"), *env_cflags),
        cuda,
        (
            *(() if stable else target.ldflags()),
            *flag_words(spec.ldflags, f"{what}'s link flag"),
            *env_ldflags,
        ),
    )


def ingredients(
    spec: OpSpec,
    target: Target,
    system: System,
    compiler: Tool | None,
    nvcc: Tool | None,
    digests: Mapping[str, str],
    builder: str = "real",
) -> dict[str, Any]:
    """Every input that changes the binary, and nothing that does not. Pure.

    ``builder`` is ``Settings.builder``: the test seam's fake builder makes another binary,
    so it is keyed (as ``env.JITOPS_BUILDER``, where earlier keys had it); the real one adds
    nothing, so real builds' keys do not depend on whether the variable was set."""
    cflags, cuda_cflags, ldflags = build_flags(spec, target, system)
    ingr = {
        "library": spec.name,
        "schemas": list(spec.schemas),
        "sources": dict(sorted(digests.items())),
        "build_sources": list(spec.sources_for(target.device)),
        "cflags": list(cflags),
        "cuda_cflags": list(cuda_cflags),
        "ldflags": list(ldflags),
        "target": {
            "name": target.name,
            "device": target.device,
            "isa": target.isa,
            "cuda_archs": list(target.archs),
        },
        "jitops_version": system.jitops_version,
        "torch_version": system.torch_version,
        "torch_git_version": system.torch_git_version,
        "torch_cuda": system.torch_cuda,
        "cxx11_abi": system.cxx11_abi,
        "python_abi": system.python_abi,
        "platform": system.platform,
        "machine": system.machine,
        "compiler": compiler_ingredient(compiler) if compiler else None,
        "nvcc": {"path": nvcc.path, "version": nvcc.version} if nvcc else None,
        "env": key_env(system.build_env, target.device, builder),
    }
    # a C-ABI library: it survives torch upgrades (its target is in cflags)
    if STABLE_ABI_FLAG in spec.cflags:
        cuda_major = (system.torch_cuda or "").split(".")[0] or None
        ingr.update(
            abi="stable",
            torch_version=None,
            torch_git_version=None,
            cxx11_abi=None,
            python_abi=None,
            torch_cuda=cuda_major if target.device == "cuda" else None,
        )
    return ingr


TOOL_INGREDIENTS = ("compiler", "nvcc")


# In the key's env only to pick a compiler or the CUDA toolkit, whose identities are "compiler" and
# "nvcc"
TOOL_ENV_VARS = ("CXX", "CC", "CUDA_HOME", "CUDA_PATH")


def without_tools(ingr: Mapping[str, Any]) -> dict[str, Any]:
    """The ingredients less the toolchain identity (the compiler, nvcc, and the variables that pick the compiler):
    what a compiler-less machine can still match (a slim image with ``CXX`` pointing at no working compiler too)."""
    out = {k: v for k, v in ingr.items() if k not in TOOL_INGREDIENTS}
    if isinstance(out.get("env"), dict):
        out["env"] = {k: v for k, v in out["env"].items() if k not in TOOL_ENV_VARS}
    return out


def compute_key(ingr: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the ingredients (never Python's hash())."""
    blob = json.dumps(ingr, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def namespace_for(library: str, key: str) -> str:
    """The TORCH_LIBRARY namespace of one build; differs per key so rebuilds coexist."""
    return f"jitops_{library}_{key[:16]}"
