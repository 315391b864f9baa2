"""The operator screen under load: its CPU share, and the delay from a metrics line to the screen.

    .venv/bin/python bench/bench_console.py [--seconds 20] [--probes 20] [--gpus 8] [--log-rate 2000] [--runs 1]
                                            [--compare] [--history STEPS]

With ``--runs N`` (N > 1) there are N containers (200, 201, ...), each with its own writer and its
own fake nvidia-smi, and the console follows them all (``--ct 200 --ct 201 ...``: the overview, one
SSH connection); once the overview is up, ``1`` puts the first run's full screen in view, and the
figures are taken with it there (the other runs are still folded and their rows kept current).
With ``--compare`` (and ``--runs`` N > 1) ``c`` opens the compare view of all N runs instead
(console/tui/compare_screen.py: legend and three graphs of every run, redrawn at most once a second),
and the figures are taken with it there; the delay is then to the compare view's legend line.
``--history STEPS``: each writer first writes STEPS past steps (a step and a throughput record a
second up to now), so the console starts on a long run's metrics.jsonl (it reads its last 4 MiB:
with 8 devices about 2,700 steps) and the compare view's series are near their cap of 2,000 points.

Everything is real except the trainer, which is a writer process that follows the run-directory
contract at a chosen rate:
- a devhost (console/devhost: asyncssh on 127.0.0.1 + the pct stand-in), container 200;
- a fake ``nvidia-smi`` on the devhost's PATH that prints ``--gpus`` GPUs every ``-lms`` ms (the
  console asks for 500 ms: 2 Hz), reached through ``pct exec`` like the real one;
- the writer (this file with ``--writer``, started as ``train_dflash_pipeline.py`` in the container so that
  the console takes it for the trainer): run.json naming itself, 2,000 train.log lines a second
  (100 every 50 ms), a throughput record for the 8 devices every 0.5 s and a step record every second;
- the console itself, ``dflash-console connect 127.0.0.1 -p PORT ... --ct 200 --run-dir RUN``, in a
  real terminal (tmux, 120x36), so the cost of drawing is counted.

CPU share: utime+stime of the console process (all its threads) over ``--seconds``, after a warm-up,
while nothing else polls it. Delay: each step record's ``t`` (taken just before its write+flush)
to the first ``tmux capture-pane`` (polled every 20 ms) whose training panel shows that step.
The machine is shared and busy (2 cores): the figures carry that noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CT = 200
TICK = os.sysconf("SC_CLK_TCK")

FAKE_SMI = """#!{python}
import sys, time
ms = 500
for a in sys.argv[1:]:
    if a.startswith("-lms="):
        ms = int(a.split("=", 1)[1])
n = {gpus}
i = 0
while True:
    for g in range(n):
        util = 95 - (i + g) % 7
        print(f"{{g}}, GPU-bench-{{g}}, NVIDIA H200, {{util}}, {{100000 + 37 * i % 4000}}, 143771, "
              f"{{600 + (i * 3 + g) % 50}}.25, {{60 + g}}", flush=True)
    i += 1
    time.sleep(ms / 1000)
"""


# --- the writer (a stand-in trainer that follows the run-directory contract) -----------------------

# The writer runs as ``python CT/train_dflash_pipeline.py --writer RUN --output-dir RUN ...``: the helper
# takes a process for the trainer only with a trainer's command line and its --output-dir (docs/trust.md).
LAUNCHER = """import runpy
runpy.run_path({bench!r}, run_name="__main__")
"""


def proc_start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def throughput_record(gpus: int, step: int) -> dict:
    half = max(1, gpus // 2)
    devs = [
        {
            "device": f"cuda:{i}",
            "uuid": f"GPU-bench-{i}",
            "role": "target" if i < half else "drafter",
            "tok_s": 14500.0 / half if i < half else 14500.0 / (gpus - half) + (step % 5) * 10,
            "busy": 0.93,
        }
        for i in range(gpus)
    ]
    return {"kind": "throughput", "devices": devs, "queue": {"depth": 20 + step % 40, "capacity": 60}}


def step_record(step: int) -> dict:
    return {
        "kind": "step",
        "step": step,
        "total_steps": 100_000,
        "epoch": step / 5000,
        "loss": 3.0 / (1 + step / 50),
        "acc": [0.9 * 0.9**k for k in range(15)],
        "accept_len": 1 + step / 100,
        "accept_len_est": 1 + 3 * step / (step + 500),
        "lr": 6e-4,
        "grad_norm": 1.0,
        "tokens": 49152,
    }


def write_history(metrics, gpus: int, steps: int) -> None:
    """``steps`` past steps (one a second up to now, a throughput record each), as a long run has."""
    now = time.time()
    for s in range(1, steps + 1):
        t = now - (steps - s)
        metrics.write(json.dumps({**step_record(s), "t": t}) + "\n")
        metrics.write(json.dumps({**throughput_record(gpus, s), "t": t + 0.5}) + "\n")
    metrics.flush()


def writer(run_dir: Path, gpus: int, log_rate: int, history: int = 0) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    cmdline = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    half = max(1, gpus // 2)
    roles = {
        "target": [f"cuda:{i}" for i in range(half)],
        "drafter": [f"cuda:{i}" for i in range(half, gpus)],
    }
    run = {
        "pid": pid,
        "start_time": proc_start_time(pid),
        "command": cmdline,
        "argv": cmdline[3:],
        "interpreter": sys.executable,
        "cwd": os.getcwd(),
        "code_dir": str(ROOT),
        "env": {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus))},
        "hostname": "bench",
        "roles": roles,
        "version": "bench",
        "output_dir": str(run_dir),
    }
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(json.dumps(run))
    os.replace(tmp, run_dir / "run.json")
    metrics = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (open until killed)
    log = open(run_dir / "train.log", "a")  # noqa: SIM115
    write_history(metrics, gpus, history)

    def emit(rec: dict) -> None:
        rec["t"] = time.time()
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()

    emit({"kind": "event", "name": "started", "pid": pid, "step": 0})
    batch = max(1, log_rate // 20)
    n, step = 0, history
    t0 = time.monotonic()
    next_tp = next_step = t0
    while True:
        now = time.monotonic()
        if now >= next_tp:
            next_tp += 0.5
            emit(throughput_record(gpus, step))
        if now >= next_step:
            next_step += 1.0
            step += 1
            emit(step_record(step))
        lines = "".join(
            f"[rank0] it {n + j} loss {3.0 / (1 + (n + j) / 5000):.4f} "
            f"tok/s 14500 queue 37/60 mem 101204MiB\n"
            for j in range(batch)
        )
        log.write(lines)
        log.flush()
        n += batch
        time.sleep(max(0.0, t0 + n / log_rate - time.monotonic()))


# --- the bench ---------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout


def last_steps(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if '"kind": "step"' in line:
            rec = json.loads(line)
            out[rec["step"]] = rec["t"]
    return out


STEP_RE = re.compile(r"step\s+([\d,]+) / 100,000")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="CPU measurement window")
    ap.add_argument("--probes", type=int, default=20, help="step records timed to the screen")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--log-rate", type=int, default=2000, help="train.log lines a second")
    ap.add_argument("--runs", type=int, default=1, help="containers, each with a writer (the overview)")
    ap.add_argument(
        "--compare", action="store_true", help="with --runs N > 1: the compare view open on all runs"
    )
    ap.add_argument("--writer", metavar="RUN_DIR", help=argparse.SUPPRESS)
    ap.add_argument(
        "--history",
        type=int,
        default=0,
        help="past steps each writer writes first (a long run's metrics.jsonl)",
    )
    ap.add_argument("--output-dir", help=argparse.SUPPRESS)  # the writer's, as a trainer's command line has
    ap.add_argument("--profile", metavar="FILE", help="run the console under cProfile, stats to FILE")
    args = ap.parse_args()
    if args.compare and args.runs < 2:
        ap.error("--compare needs --runs 2 or more (the compare view opens from the overview)")
    if args.writer:
        writer(Path(args.writer), args.gpus, args.log_rate, args.history)
        return 0

    from console.devhost.thread import DevHostThread

    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    session = f"bench-console-{os.getpid()}"
    procs: list[subprocess.Popen] = []
    with DevHostThread(tmp / "host", env={"OMP_NUM_THREADS": "1"}) as h:
        smi = h.bin_dir / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(python=sys.executable, gpus=args.gpus))
        smi.chmod(0o755)
        cts = [CT + i for i in range(args.runs)]
        for n in cts:
            ct_dir = h.add_container(n)
            launcher = (
                ct_dir / "train_dflash_pipeline.py"
            )  # the console follows only a trainer's command line
            launcher.write_text(LAUNCHER.format(bench=str(Path(__file__).resolve())))
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(launcher),
                        "--writer",
                        str(ct_dir / "run"),
                        "--output-dir",
                        str(ct_dir / "run"),
                        "--gpus",
                        str(args.gpus),
                        "--log-rate",
                        str(args.log_rate),
                        "--history",
                        str(args.history),
                    ],
                    cwd=ct_dir,
                )
            )
        run_dir = h.container_dir(CT) / "run"
        console = [
            str(Path(sys.executable).parent / "dflash-console"),
            "connect",
            "127.0.0.1",
            "-p",
            str(h.host.port),
            "-l",
            h.host.user,
            "-i",
            str(h.client_key_path),
            "--known-hosts",
            str(h.known_hosts_path),
            "-F",
            "/dev/null",
            *[a for n in cts for a in ("--ct", str(n))],
            "--run-dir",
            "run" if args.runs > 1 else str(run_dir),
        ]
        if args.profile:
            console = [sys.executable, "-m", "cProfile", "-o", args.profile, *console]
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "36", shlex.join(console)],
            check=True,
        )
        pid = -1
        try:
            pid = int(
                subprocess.run(
                    ["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()[0]
            )
            end = time.monotonic() + 60
            if args.runs > 1:  # the overview first: open the first run's full screen (or the compare view)
                while time.monotonic() < end and f"{args.runs} runs" not in capture(session):
                    time.sleep(0.5)
                time.sleep(2)
                subprocess.run(["tmux", "send-keys", "-t", session, "c" if args.compare else "1"], check=True)
            while time.monotonic() < end and not STEP_RE.search(capture(session)):
                time.sleep(0.5)
            screen = capture(session)
            if not STEP_RE.search(screen):
                print(screen)
                raise SystemExit("the console never showed a step")
            time.sleep(5)  # warm-up: history, plots and the log at full rate
            c0, w0 = cpu_s(pid), time.monotonic()
            time.sleep(args.seconds)
            c1, w1 = cpu_s(pid), time.monotonic()
            share = (c1 - c0) / (w1 - w0)
            screen_cpu = capture(session)

            delays: list[float] = []
            seen = {int(STEP_RE.search(capture(session)).group(1).replace(",", ""))}
            deadline = time.monotonic() + args.probes * 1.0 + 15
            while len(delays) < args.probes and time.monotonic() < deadline:
                m = STEP_RE.search(capture(session))
                now = time.time()
                if m:
                    s = int(m.group(1).replace(",", ""))
                    if s not in seen:
                        seen.add(s)
                        t = last_steps(run_dir).get(s)
                        if t is not None and s - 1 in seen:  # only steps whose predecessor was seen
                            delays.append(now - t)
                time.sleep(0.02)
        finally:
            subprocess.run(["tmux", "send-keys", "-t", session, "q"], capture_output=True)  # quit cleanly
            end = time.monotonic() + 10
            while time.monotonic() < end and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
            for p in procs:
                p.terminate()
                p.wait(10)

    print(screen_cpu)
    log_lines = re.search(r"([\d,]+) lines", screen_cpu)
    print(
        f"console CPU share: {share:.3f} core over {w1 - w0:.1f} s "
        f"({args.runs} run(s) x {args.gpus} GPUs at 2 Hz, {args.log_rate} log lines/s each, "
        + (
            f"the compare view open on all {args.runs} runs)"
            if args.compare
            else f"log view holding {log_lines.group(1) if log_lines else '?'} lines)"
        )
    )
    if delays:
        delays.sort()
        print(
            f"metrics line -> screen: median {statistics.median(delays) * 1000:.0f} ms, "
            f"p90 {delays[int(0.9 * (len(delays) - 1))] * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms "
            f"over {len(delays)} step records (capture-pane polled every 20 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
