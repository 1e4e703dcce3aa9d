"""Ctrl-C during a real build: control returns within 2 s, no compiler survives, no lock sticks.

A child process builds a user kernel into a fresh cache; once the compiler
(cc1plus) is running, the test sends SIGINT to the child alone, as Jupyter's
"interrupt kernel" does. The child then waits while the test inspects /proc
and the lock, and finally builds the same kernel again, in the same process.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import filelock
import pytest

from tests.helpers import REPO, child_env, processes, scenario_argv

pytestmark = [pytest.mark.process, pytest.mark.compile]

# The user kernel the child builds (tests/scenarios_inert.py:ctrl_c_load_inline).
SRC = """#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

at::Tensor squared_relu(const at::Tensor& x) {
  at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] * in[i] : 0.f;
  return out;
}

JITOPS_LIBRARY(m) { m.def("squared_relu(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("squared_relu", &squared_relu); }
"""


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (command name, parent pid, process group) for every process."""
    return {p.pid: (p.comm, p.ppid, p.pgid) for p in processes()}


def _descendants(root: int, procs: dict[int, tuple[str, int, int]]) -> set[int]:
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (_, ppid, _) in procs.items() if ppid in frontier} - found
        found |= frontier
    return found


@pytest.mark.timeout(400)
def test_ctrl_c_during_build_leaves_no_compiler_and_no_stuck_lock(private_cache: Path) -> None:
    child = subprocess.Popen(
        scenario_argv("scenarios_inert.ctrl_c_load_inline", name="ctrlc", source=SRC),
        cwd=REPO,
        env=child_env(JITOPS_CACHE_DIR=str(private_cache)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            output.append(line)
            if line.startswith("{"):
                lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def report(timeout: float) -> dict[str, object]:
        try:
            return json.loads(lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(
                f"child said nothing for {timeout}s; output:\n{''.join(output)}"
            ) from None

    try:
        assert report(120)["state"] == "building"
        deadline = time.monotonic() + 180
        while True:  # wait until the compiler proper is running under the child
            procs = _processes()
            tree = _descendants(child.pid, procs)
            if any(procs[p][0] == "cc1plus" for p in tree):
                break
            assert child.poll() is None, "".join(output)
            assert time.monotonic() < deadline, "no compiler appeared"
            time.sleep(0.05)
        groups = {procs[p][2] for p in tree}
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        first = report(30)
        returned = time.monotonic() - sent
        assert first == {"state": "interrupted", "type": "BuildInterrupted", "jitops_error": True}
        assert returned < 2.0, f"control came back after {returned:.2f}s"

        procs = _processes()
        left = [
            (pid, info) for pid, info in procs.items() if info[2] in groups and pid != child.pid
        ]
        assert left == [] and _descendants(child.pid, procs) == set(), left
        base = private_cache / "v1"
        assert list((base / "staging").iterdir()) == []
        assert (
            not (base / "entries").exists() or list((base / "entries").rglob("manifest.json")) == []
        )
        locks = list((base / "locks").glob("ctrlc-*.lock"))
        assert len(locks) == 1
        held = filelock.FileLock(str(locks[0]))
        held.acquire(timeout=0)  # free at once: nobody holds it
        held.release()

        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert report(300) == {"state": "rebuilt", "built": True, "ok": True}
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
