"""Build supervisor: ``python -I -S _supervise.py PARENT_PID CMD...``.

It runs as the leader of its own process group (the caller starts it with
``start_new_session=True``), asks the kernel for SIGTERM when its parent dies
(Linux ``PR_SET_PDEATHSIG``), and on SIGTERM, SIGINT or SIGHUP kills its whole
group: ninja, the compiler driver and cc1plus included. So no compiler keeps
running or writing once the process that asked for the build is gone.

Standard library only, no jitops or torch import: it starts in milliseconds.
"""

import os
import signal
import subprocess
import sys


def _kill_group(signum=None, frame=None):
    try:
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
    proc = subprocess.Popen(cmd)
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
