"""Subpackage ``jitops.target`` (stage 6): the machine and its tools. Owns: this module (``probe``,
``System``, ``Target``, ``choose_target``, ``BUILD_ENV_VARS``), ``archs`` (CUDA arch lists, ``-gencode``),
``toolchain`` (``Tool``, ``find_cxx`` / ``find_nvcc`` / ``find_ninja``) and ``compilers`` (``cxx``,
``kind_of``, ``openmp_flags``, ``compiler_ingredient``). May import: ``jitops.registry`` and the stages
below it (kernels, spec, base, errors, _version); today spec.checks, base, errors, _version.

This module: probing the system, and the pure decisions made from what was probed.

``probe()`` is the only function here that looks at the machine. It returns a
frozen :class:`System`. Choosing a target, the flags for it and the CUDA arch
list are pure functions of that value, so GPU cases are unit-tested on a
CPU-only machine by building a ``System`` by hand.

Imports: archs, errors, record, _version; torchcompat lazily. Holds the build variables the probe records
(``BUILD_ENV_VARS``: host ones in every key, CUDA ones in CUDA keys only; key.env_vars_for picks).
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import platform
import shutil
import sys
import threading
from collections.abc import Mapping
from dataclasses import field

from .._version import __version__
from ..base.record import record
from ..errors import TargetError

# Flags for the CPU ISA that torch itself dispatches to here. at::vec picks
# its 256/512-bit implementations from the CPU_CAPABILITY_* macro.
_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    # -mf16c: every AVX512 CPU has it, and at::vec's AVX2 flavour (used by add) needs it.
    "AVX512": (
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
        "-mf16c",
        "-DCPU_CAPABILITY_AVX512",
    ),
    "AVX2": ("-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2"),
}

BASE_CFLAGS = ("-O3", "-fvisibility=hidden", "-fno-math-errno")
# at::parallel_for is a header template: without -fopenmp it compiles to a
# plain serial loop, even though torch runs its own kernels on OpenMP threads.
# Linking with it names libgomp.so.1, which resolves to the copy torch loaded.
OPENMP_FLAGS = ("-fopenmp",)
# no --use_fast_math: nms must decide IoU ties as torchvision does
BASE_CUDA_CFLAGS = (
    "-O3",
    "-lineinfo",
)


# Variables that change what the host compiler produces: in every key.
HOST_ENV_VARS = ("CXX", "CC", "CFLAGS", "CXXFLAGS", "LDFLAGS")
# Variables that only a CUDA build reads: nvcc itself (NVCC_*), the arch list,
# and the toolkit/cuDNN paths torch.utils.cpp_extension reads in-process while
# the ninja file is written (so scrubbing cannot reach them). In CUDA keys only.
CUDA_ENV_VARS = (
    "TORCH_CUDA_ARCH_LIST",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_INC_PATH",
    "CUDNN_HOME",
    "CUDNN_PATH",
)
# Everything the probe records (System.build_env); the key picks per target (key.env_vars_for).
BUILD_ENV_VARS = HOST_ENV_VARS + CUDA_ENV_VARS


@record
class System:
    """Everything about this machine and process that can change a binary."""

    torch_version: str
    torch_git_version: str
    torch_cuda: str | None
    cxx11_abi: bool
    python_abi: str
    platform: str
    machine: str
    cpu_capability: str
    build_env: tuple[tuple[str, str], ...] = ()
    cuda_available: bool = False
    device_capability: tuple[int, int] | None = None
    torch_cuda_archs: tuple[
        str, ...
    ] = ()  # torch.cuda.get_arch_list(): "sm_80", ..., "compute_120"
    openmp: bool = False
    jitops_version: str = __version__

    def env(self, name: str) -> str | None:
        return dict(self.build_env).get(name)


@functools.lru_cache(maxsize=1)
def _torch_facts() -> tuple[str, str, str | None, bool, str, bool]:
    import torch

    from ..base.torchcompat import check_version

    check_version(torch.__version__)  # one warning outside the tested range
    return (
        torch.__version__,
        str(getattr(torch.version, "git_version", "")),
        torch.version.cuda,
        bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        str(torch.backends.cpu.get_cpu_capability()),
        bool(torch.backends.openmp.is_available()),
    )


_sysconfig_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _python_abi() -> str:
    # CPython on POSIX names extension modules "." + SOABI + ".so" first: SOABI without importing
    # sysconfig and its _sysconfigdata (~1.5 ms on a warm load). Elsewhere, sysconfig's; it fills
    # its variables lazily and not thread-safely (3.11): a second thread can read None while the
    # first is still filling them in, which gave racing threads different keys. Fill them once,
    # under a lock.
    first = (
        importlib.machinery.EXTENSION_SUFFIXES[0] if importlib.machinery.EXTENSION_SUFFIXES else ""
    )
    if first.startswith(".cpython-") and first.endswith(".so") and first.count(".") == 2:
        return first[1:-3]
    import sysconfig

    with _sysconfig_lock:
        return str(sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag)


def build_env(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    env = os.environ if environ is None else environ
    return tuple((k, env[k]) for k in BUILD_ENV_VARS if env.get(k))


def cxx_command(system: System) -> str | None:
    """The C++ compiler cpp_extension would run (``$CXX``, else ``c++``) found on ``PATH``, as an absolute path (links
    kept), or None: ``toolchain.find_cxx``'s lookup, which the drop-in's recall repeats without importing toolchain."""
    found = shutil.which(system.env("CXX") or "c++")
    return os.path.abspath(found) if found else None


def probe(environ: Mapping[str, str] | None = None, *, cuda: bool = True) -> System:
    """Read the facts about this process. Cheap: no subprocess, no file write. ``cuda=False`` reads no CUDA
    device facts (a CPU plan needs none, and reading them initialises CUDA in torch).

    The torch facts are read once per process; the build environment is read
    on every call so that a notebook that changes ``CXXFLAGS`` gets a new key.
    """
    torch_version, git, torch_cuda, abi, capability, openmp = _torch_facts()
    cuda_available = False
    device_capability = None
    torch_cuda_archs: tuple[str, ...] = ()
    if cuda and torch_cuda:
        import torch

        # A process forked after its parent used CUDA cannot use CUDA (torch raises on the first
        # call that would initialise it, get_device_capability included): there, as torch would have
        # it, CUDA is not available.
        bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)()
        cuda_available = not bad_fork and bool(torch.cuda.is_available())
        if cuda_available:
            major, minor = torch.cuda.get_device_capability()
            device_capability = (int(major), int(minor))
            torch_cuda_archs = tuple(torch.cuda.get_arch_list())
    return System(
        torch_version=torch_version,
        torch_git_version=git,
        torch_cuda=torch_cuda,
        cxx11_abi=abi,
        python_abi=_python_abi(),
        platform=sys.platform,
        machine=platform.machine(),
        cpu_capability=capability,
        build_env=build_env(environ),
        cuda_available=cuda_available,
        device_capability=device_capability,
        torch_cuda_archs=torch_cuda_archs,
        openmp=openmp,
    )


# ------------------------------------------------------------------ targets


@record
class Target:
    """What a build is for: ``cpu`` (with its ISA) or ``cuda`` with an arch list."""

    device: str
    isa: str = "DEFAULT"
    archs: tuple[str, ...] = field(default=())
    openmp: bool = False  # torch runs at::parallel_for on OpenMP: build with it too

    @property
    def name(self) -> str:
        """Directory-safe, deterministic name: ``cpu-avx512``, ``cuda-sm80-sm90ptx``."""
        if self.device == "cpu":
            return f"cpu-{self.isa.lower()}"
        parts = [a.replace(".", "").replace("+PTX", "ptx").lower() for a in self.archs]
        return "cuda-" + "-".join("sm" + p for p in parts)

    def cflags(self) -> tuple[str, ...]:
        return self.isa_cflags() + (OPENMP_FLAGS if self.openmp else ())

    def isa_cflags(self) -> tuple[str, ...]:
        """-O3 and the ISA's flags, without OpenMP (a builtin library on torch's stable ABI: key.build_flags)."""
        return BASE_CFLAGS + _ISA_FLAGS.get(self.isa, ())

    def ldflags(self) -> tuple[str, ...]:
        return OPENMP_FLAGS if self.openmp else ()

    def cuda_cflags(self) -> tuple[str, ...]:
        if self.device != "cuda":
            return ()
        from .archs import arch_gencode_flags  # (CUDA only: a CPU load never imports archs)

        return BASE_CUDA_CFLAGS + arch_gencode_flags(self.archs)


def choose_target(
    system: System, device: str | None = None, archs: str | tuple[str, ...] | None = None
) -> Target:
    """Pick the build target. Pure: everything it needs is in ``system``.

    ``device=None`` means the current device: CUDA when a GPU is usable, else
    CPU. For CUDA the arch list comes from ``archs``, else
    ``TORCH_CUDA_ARCH_LIST``, else the current GPU's capability. A failure
    lists each candidate and why it was rejected.
    """
    if device is None:
        device = "cuda" if system.cuda_available else "cpu"
    if device == "cpu":
        return Target("cpu", system.cpu_capability, openmp=system.openmp)
    if device != "cuda":
        raise TargetError(f"unknown device {device!r}: expected 'cpu' or 'cuda'")
    if not system.torch_cuda:
        raise TargetError(
            f"cannot build for cuda: this torch ({system.torch_version}) is a CPU-only build "
            "(torch.version.cuda is None); install a CUDA build of torch, or use device='cpu'"
        )
    from .archs import default_arch, parse_arch_list  # (CUDA only: a CPU load never imports archs)

    env_archs = (system.env("TORCH_CUDA_ARCH_LIST") or "").strip()
    if archs:
        arch_list = parse_arch_list(archs if isinstance(archs, str) else ",".join(archs))
    elif env_archs and env_archs.lower() != "native":
        arch_list = parse_arch_list(env_archs)
    elif system.device_capability is not None:
        arch_list = (default_arch(system.device_capability, system.torch_cuda_archs),)
    else:
        env_why = "is 'native', which needs a GPU" if env_archs else "is not set"
        raise TargetError(
            "cannot choose CUDA archs to build for: no arch list was given, "
            f"TORCH_CUDA_ARCH_LIST {env_why}, and no GPU is visible to read its compute capability from. "
            "Fix: name the archs explicitly, e.g. `jitops warm --device cuda --arch 8.0,9.0 --all` "
            "(or archs='8.0,9.0', or TORCH_CUDA_ARCH_LIST='8.0;9.0')"
        )
    return Target("cuda", system.cpu_capability, arch_list, openmp=system.openmp)
