"""One measured child process: its output lines time-stamped into a log, the peak resident memory of its whole
process tree (sampled from /proc every 0.2 s: the sum over the tree, so a trainer's worker processes count),
its wall time and the load average at its start and end."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(pid: int) -> float:
    seen, todo, total = set(), [pid], 0
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_kb(p)
        todo += _children(p)
    return total / 1024


def run(argv: list[str], log_path: str, env: dict | None = None, cwd: str | None = None,
        timeout: float | None = None) -> dict:  # fmt: skip
    """Run ``argv`` to its end; (rc, seconds, peak_rss_mb, load averages, the (t, line) pairs it printed)."""
    load0, t0 = os.getloadavg(), time.monotonic()
    lines: list[tuple[float, str]] = []
    peak = [0.0]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=cwd, errors="replace")  # fmt: skip
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss_mb(proc.pid))

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        for line in proc.stdout:
            t = time.monotonic() - t0
            lines.append((t, line.rstrip("\n")))
            log.write(f"{t:9.2f} {line}")
            log.flush()
            if timeout and t > timeout:
                proc.kill()
        rc = proc.wait()
        done.set()
        th.join()
    return {"rc": rc, "seconds": time.monotonic() - t0, "peak_rss_mb": round(peak[0], 1),
            "load_avg_start": list(load0), "load_avg_end": list(os.getloadavg()), "lines": lines}  # fmt: skip
