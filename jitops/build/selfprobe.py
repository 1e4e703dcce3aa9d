"""The self-check's probe: a tiny op whose kernel throws, built with the toolchain under test and run in a
CHILD process (torch's libraries through ctypes, no ``import torch``), which reports whether the C++ error reached
torch's catch as ``c10::Error`` (where torch's Python bindings turn it into ``RuntimeError``). Writes nothing outside a
temporary folder; the policy (when to run it, what to remember) is selfcheck.py's.

Imports: runner (lazily), compilers, errors, key, target.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..target import compilers
from ..errors import BuildInterrupted
from ..key import extra_env_flags
from ..target import System

PROBE_VERSION = 3  # bump when the probe's source or command line changes
NAMESPACE = "jitops_selfcheck"
# The kernel throws a c10::Error (TORCH_CHECK) from the extension's own frames into torch's
# dispatcher: the path every jitops kernel's errors take. It is registered through torch's C shim
# (aoti_torch_library_*, the calls STABLE_TORCH_LIBRARY makes) rather than <torch/library.h>: the
# probe then parses c10's Exception.h and a C header, 1.2-1.8 s to build here instead of 8-9 s, and
# what it tests (a C++ exception unwinding through frames this toolchain compiled and linked) is the
# same. A boxed kernel's stack holds an int argument as its int64 bits.
_PROBE_CPP = """\
// jitops toolchain self-check: a kernel that throws a c10::Error (TORCH_CHECK).
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <cstring>
static void jitops_probe(StableIValue* stack, uint64_t, uint64_t) {
  int64_t x = 0;
  std::memcpy(&x, stack, sizeof x);
  TORCH_CHECK(x < 0, "jitops self-check: expected error for ", x);
}
namespace {
struct Register {
  Register() {
    TorchLibraryHandle def = nullptr, impl = nullptr;  // kept for the life of the process, as a TORCH_LIBRARY's are
    TORCH_CHECK(aoti_torch_library_init_def("NAMESPACE", __FILE__, __LINE__, &def) == AOTI_TORCH_SUCCESS &&
                aoti_torch_library_def(def, "probe(int x) -> int") == AOTI_TORCH_SUCCESS &&
                aoti_torch_library_init_impl("NAMESPACE", "CompositeExplicitAutograd", __FILE__, __LINE__, &impl)
                    == AOTI_TORCH_SUCCESS &&
                aoti_torch_library_impl(impl, "probe", &jitops_probe) == AOTI_TORCH_SUCCESS,
                "jitops self-check: registering the probe op failed");
  }
} register_probe;
}  // namespace
""".replace("NAMESPACE", NAMESPACE)
# The child loads torch's C++ libraries with ctypes and calls the op through the C shim's dispatcher
# entry (aoti_torch_call_dispatcher), whose catch records the error; no `import torch`, so the child
# costs ~0.35 s instead of ~2.5 s. The error unwinds from the probe's frames through torch's
# dispatcher to torch's catch, the path every kernel's errors take (above it, torch's Python
# bindings only translate a caught c10::Error). Torch's catch records a c10::Error's text without
# its backtrace; a c10::Error whose type did not match across the two libraries falls to its
# std::exception catch, which records what(), backtrace included, so the exact text also proves the
# type matched.
_CHILD = f"""\
import ctypes, sys
lib = sys.argv[2]
ctypes.CDLL(lib + "/libc10.so", mode=ctypes.RTLD_GLOBAL)
torch_cpu = ctypes.CDLL(lib + "/libtorch_cpu.so", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(sys.argv[1])
call = torch_cpu.aoti_torch_call_dispatcher
call.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
what = torch_cpu.torch_exception_get_what_without_backtrace
what.restype = ctypes.c_char_p
if call(b"{NAMESPACE}::probe", b"", (ctypes.c_uint64 * 1)(7)) == 0:
    print("JITOPS_SELFCHECK no error raised", flush=True)
    sys.exit(4)
text = (what() or b"").decode(errors="replace")
ok = text == "jitops self-check: expected error for 7"
said = "ok" if ok else "wrong message: " + (text.splitlines() or ["(none)"])[0][:200]
print("JITOPS_SELFCHECK " + said, flush=True)
sys.exit(0 if ok else 3)
"""


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str  # what happened, one line
    seconds: float
    compiler: str  # the command run, with its identity
    cached: bool = False
    built: bool = True  # False: the probe did not even compile and link


def _cxx_standard(torch_root: Path) -> str:
    """The -std= that torch's cpp_extension compiles with (c++17 up to torch 2.9ish, c++20 since), read
    from its source so the probe parses torch's headers as real builds do; importing it costs ~33 ms more."""
    try:
        text = (torch_root / "utils" / "cpp_extension.py").read_text()
    except OSError:
        return "-std=c++17"
    m = re.search(r"common_cflags \+= \['-std=(c\+\+\d+)'", text)
    return f"-std={m.group(1)}" if m else "-std=c++17"


def _torch_root() -> Path:
    import torch

    return Path(torch.__file__).parent


def _probe_command(
    system: System, cxx: str, compiler: dict[str, Any], src: Path, out: Path
) -> list[str]:
    root = _torch_root()
    env_cflags, env_ldflags = extra_env_flags(system)
    omp = compilers.build_flags(["-fopenmp"], compiler) if compiler.get("openmp") else []
    return [
        cxx,
        "-shared",
        "-fPIC",
        _cxx_standard(root),
        "-O0",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(system.cxx11_abi)}",
        "-isystem",
        str(root / "include"),
        *omp,
        *env_cflags,
        str(src),
        "-o",
        str(out),
        f"-L{root / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
        *omp,
        *env_ldflags,
    ]


def run_probe(system: System, cxx: str, compiler: dict[str, Any]) -> Result:
    """Build the probe with ``cxx`` and check it in a child process. Writes nothing outside a temp dir."""
    from .runner import run_supervised  # miss path only

    start = time.monotonic()
    who = f"{cxx} ({compiler.get('version', '?')})"
    with tempfile.TemporaryDirectory(prefix="jitops-selfcheck-") as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "libjitops_selfcheck.so"
        src.write_text(_PROBE_CPP)
        env = dict(os.environ, TMPDIR=tmp)
        cmd = _probe_command(system, cxx, compiler, src, lib)
        try:
            rc, out = run_supervised(cmd, cwd=Path(tmp), env=env)
        except KeyboardInterrupt as e:  # the supervisor already stopped the compiler
            raise BuildInterrupted(
                "toolchain self-check interrupted; the compiler was stopped and nothing was cached"
            ) from e
        if rc != 0 or not lib.is_file():
            first = next(
                (ln for ln in out.splitlines() if "error" in ln),
                out.strip().splitlines()[-1:] or [""],
            )
            first = first if isinstance(first, str) else first[0]
            return Result(
                False,
                f"cannot build the probe op (exit {rc}): {first[:300]}  [command: "
                f"{shlex.join(cmd)}]",
                time.monotonic() - start,
                who,
                built=False,
            )
        loaded: int | None
        try:
            child = subprocess.run(
                [sys.executable, "-c", _CHILD, str(lib), str(_torch_root() / "lib")],
                capture_output=True,
                text=True,
                timeout=180,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=tmp,
                check=False,
            )
            loaded, text = child.returncode, (child.stdout + child.stderr)
        except subprocess.TimeoutExpired:
            loaded, text = None, "timed out after 180 s"
        except KeyboardInterrupt as e:  # subprocess.run killed the child
            raise BuildInterrupted("toolchain self-check interrupted; nothing was cached") from e
    seconds = time.monotonic() - start
    if loaded == 0:
        return Result(
            True,
            "a C++ error thrown by the probe op reached torch's dispatcher as c10::Error",
            seconds,
            who,
        )
    if loaded is not None and loaded < 0:
        try:
            sig = signal.Signals(-loaded).name
        except ValueError:
            sig = f"signal {-loaded}"
        why = f"the process was killed by {sig} when the probe op threw a C++ error"
    else:
        said = [ln for ln in text.splitlines() if ln.strip()]
        mark = next(
            (ln for ln in said if ln.startswith("JITOPS_SELFCHECK")), said[-1] if said else ""
        )
        why = (
            f"the probe op's error did not reach torch as c10::Error (exit {loaded}): {mark[:300]}"
        )
    return Result(False, why, seconds, who)
