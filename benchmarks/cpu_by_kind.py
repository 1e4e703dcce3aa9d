"""Where a long run's CPU goes: sample /proc once a second, CPU seconds by kind of process.

    python benchmarks/cpu_by_kind.py sample OUT.jsonl STOP_FILE   # until STOP_FILE exists
    python benchmarks/cpu_by_kind.py legs OUT.jsonl CI.log START_EPOCH

`sample` appends one JSON line per second: the machine's total and idle CPU seconds
(/proc/stat) and the CPU seconds so far of each kind of process seen: background PCH builds
(idle scheduling class, or a child of one), compilers, pytest and its workers, scenario
interpreters, other Python, other. A process that lives under a second may be missed.
`legs` splits the samples at CI's "== LEG took Ns" lines (from START_EPOCH, CI's start).
Linux only; reads nothing but /proc.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

SCHED_IDLE = 5
COMPILERS = ("cc1plus", "cc1", "cicc", "ptxas", "cudafe", "ld", "collect2", "as", "nvcc")
COMPILERS += ("fatbinary", "nvlink", "clang")


def _stat(pid: int) -> tuple[str, int, int, int]:
    """A process's name, parent, CPU ticks (user + system) and scheduling policy."""
    text = Path(f"/proc/{pid}/stat").read_text()
    close = text.rindex(")")
    name = text[text.index("(") + 1 : close]
    fields = text[close + 2 :].split()  # fields[0] is the state, field 3 of proc(5)
    return name, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[38])


def _kind(pid: int, name: str, parent_kind: str | None, policy: int) -> str:
    if policy == SCHED_IDLE or parent_kind == "bg":
        return "bg"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmd = b""
    if b"pch_bg import child_main" in cmd:
        return "bg"
    if name.startswith(COMPILERS):
        return "compile"
    if name.startswith(("python", "pytest")):
        if b"pytest" in cmd or b"sys.stdin.readline" in cmd:  # execnet's worker start-up line
            return "pytest"
        return "scenario" if b"scenario_main" in cmd else "python"
    return "other"


def sample(out_path: str, stop_file: str) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict[int, dict[str, Any]] = {}  # pid -> kind, name, ticks
    ended: dict[str, int] = {}  # ticks of processes whose pid was reused
    with open(out_path, "a") as out:
        while not os.path.exists(stop_file):
            began = time.time()
            with open("/proc/stat") as f:
                cpu = [int(x) for x in f.readline().split()[1:]]
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                pid = int(entry)
                try:
                    name, ppid, ticks, policy = _stat(pid)
                except (OSError, ValueError, IndexError):
                    continue  # ended while read
                known = seen.get(pid)
                if known is not None and known["name"] != name and ticks < known["ticks"]:
                    ended[known["kind"]] = ended.get(known["kind"], 0) + known["ticks"]
                    known = None  # a new process under a reused pid
                if known is None:
                    parent = seen.get(ppid, {}).get("kind")
                    seen[pid] = {"kind": _kind(pid, name, parent, policy), "name": name}
                    seen[pid]["ticks"] = ticks
                else:
                    known["ticks"] = max(known["ticks"], ticks)
                    if policy == SCHED_IDLE:  # a PCH child lowers itself after it starts
                        known["kind"] = "bg"
            sums = dict(ended)
            for p in seen.values():
                sums[p["kind"]] = sums.get(p["kind"], 0) + p["ticks"]
            row = {"t": began, "total": sum(cpu) / hz, "idle": (cpu[3] + cpu[4]) / hz}
            row.update({k: v / hz for k, v in sums.items()})
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(max(0.1, 1.0 - (time.time() - began)))


def legs(samples_path: str, log_path: str, start: float) -> None:
    rows = [json.loads(line) for line in open(samples_path)]
    kinds = sorted({k for r in rows for k in r} - {"t", "total", "idle"})

    def at(t: float) -> dict[str, float]:
        return max((r for r in rows if r["t"] <= t), key=lambda r: r["t"], default=rows[0])

    t = start
    for name, secs in re.findall(r"^== (.*) took (\d+)s", Path(log_path).read_text(), re.M):
        a, b = at(t), at(t + int(secs))
        t += int(secs)
        total, idle = b["total"] - a["total"], b["idle"] - a["idle"]
        if total <= 0:
            continue
        print(f"{name}: {secs} s wall, {100 * idle / total:.1f} % idle, {total - idle:.0f} CPU-s")
        print("    " + ", ".join(f"{k} {b.get(k, 0) - a.get(k, 0):.0f}" for k in kinds))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "legs":
        legs(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
