"""Build supervisor: ``python -I -S _supervise.py PARENT_PID CMD...``.

It runs as the leader of its own process group (the caller starts it with
``start_new_session=True``), asks the kernel for SIGTERM when its parent dies
(Linux ``PR_SET_PDEATHSIG``), and on SIGTERM, SIGINT or SIGHUP kills every
process below it. A process group is not enough: ninja puts each compile
command in a process group of its own. So the supervisor is also a child
subreaper (``PR_SET_CHILD_SUBREAPER``): a compiler orphaned by a dying ninja
is re-parented to it, and the sweep walks ``/proc`` until no descendant is
left. No compiler keeps running or writing once the process that asked for
the build is gone.

Started with no command (``python -I -S _supervise.py PARENT_PID``), it reads one from stdin up to
its end: ``cwd``, the number of arguments, the arguments, then ``NAME=value`` environment entries,
all NUL-separated. So the caller can start it ahead of the command (``runner``'s spare) and a build
does not wait for a Python start-up; stdin closed with nothing on it: it exits.

Standard library only, no jitops or torch import, and of that only what starts fast: every build
command may wait for this script's start-up, so ``_signal`` stands in for ``signal`` (which
imports ``enum``) and ``os.posix_spawnp`` for ``subprocess``.

Imports: nothing (it runs as a script: python -I -S _supervise.py).
"""

import _signal
import os
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _descendants():
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    found, todo = [], [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), ()):
            found.append(c)
            todo.append(c)
    return found


def _kill_all(signum=None, frame=None):
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            pids = _descendants() if os.path.isdir("/proc/self") else []
            for pid in pids:
                try:
                    os.kill(pid, _signal.SIGKILL)
                except OSError:
                    pass
            while True:  # reap what died (orphans re-parented to us included)
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
            if not pids:
                break
            time.sleep(0.005)
    finally:
        try:
            os.killpg(os.getpgid(0), _signal.SIGKILL)
        finally:
            os._exit(128 + (signum or _signal.SIGKILL))


def main() -> int:
    parent = int(sys.argv[1])
    cmd = sys.argv[2:]
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, _kill_all)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, _signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        _kill_all(_signal.SIGTERM)
    env = dict(os.environ)
    if not cmd:  # the command comes on stdin
        fields = [os.fsdecode(f) for f in sys.stdin.buffer.read().split(b"\0")]
        if fields == [""]:
            return 0
        n = int(fields[1])
        cmd = fields[2 : 2 + n]
        env = dict(f.split("=", 1) for f in fields[2 + n :] if "=" in f)
        os.chdir(fields[0])
    # the command starts with default dispositions: handled ones reset by the spawn, and the two
    # Python ignores (SIGPIPE, SIGXFSZ) named; its stdin is /dev/null, not the request's pipe
    pid = os.posix_spawnp(
        cmd[0],
        cmd,
        env,
        file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
        setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),
    )
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    # no interpreter teardown: the build waits for this process's end (its output's EOF)
    os._exit(main())
