"""Build supervisor: ``python -I -S _supervise.py PARENT_PID CMD...``.

It runs as the leader of its own process group (the caller starts it with
``start_new_session=True``), asks the kernel for SIGTERM when its parent dies
(Linux ``PR_SET_PDEATHSIG``), and on SIGTERM, SIGINT or SIGHUP stops ninja
(which stops the compiles it runs in groups of their own) and kills its whole
group: ninja, the compiler driver and cc1plus included. So no compiler keeps
running or writing once the process that asked for the build is gone.

Standard library only, no jitops or torch import: it starts in milliseconds.
"""

import os
import signal
import subprocess
import sys
import time


_child_pid = 0


def _kill_group(signum=None, frame=None):
    # ninja runs every compile in a process group of its own, so killing our
    # group alone would orphan the compilers. SIGTERM to ninja first: it
    # forwards the signal to each compile's group. Then SIGKILL what is left.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if _child_pid:
            try:
                os.kill(_child_pid, signal.SIGTERM)
                for _ in range(60):  # up to 3 s for ninja to stop its compiles
                    if os.waitpid(_child_pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.05)
            except OSError:
                pass
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(128 + (signum or signal.SIGKILL))


def main() -> int:
    parent = int(sys.argv[1])
    cmd = sys.argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _kill_group)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        _kill_group(signal.SIGTERM)
    global _child_pid
    proc = subprocess.Popen(cmd)
    _child_pid = proc.pid
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
