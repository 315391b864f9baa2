"""The multi-process pipeline on CPU (gloo on loopback): 1 target + 2 drafter workers and their launcher.

Real processes, real signals: DDP replicas compute what one process with the same total grad-accum does;
SIGINT stops every rank with one checkpoint; a SIGKILLed worker is reported and what can be saved is; a
SIGKILLed launcher takes its workers with it.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.trainer_run import (
    Trainer,
    events,
    phases,
    records,
    session_members,
    startup,
    steps,
    tiny_flags,
    wait_for_record,
    wait_for_step,
)
from trainer.run import checkpoint

pytestmark = pytest.mark.e2e

MULTI = ("--drafter-gpus", "cpu,cpu")  # with tiny_flags' --target-gpus cpu: 3 worker processes
EXTRA = ("--noise-start", "0.2", "--noise-end", "0.05", "--seed", "5")


def _worker_pids(t: Trainer) -> list[int]:
    line = t.wait_line("launched ", timeout=120)  # "launched 3 workers (...): pids A B C"
    return [int(x) for x in line.split("pids", 1)[1].split()]


def _gone(pids: list[int], sid: int, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        import os

        if not session_members(sid) and not any(os.path.exists(f"/proc/{p}") for p in pids):
            return True
        time.sleep(0.1)
    return False


def _drafter_tok_s(r: dict) -> bool:
    return r["kind"] == "throughput" and sum(d["tok_s"] for d in r["devices"] if d["role"] == "drafter") > 0


def test_ddp_replicas_match_one_process_and_sigint_stops_every_rank(tiny_assets, tmp_path):
    """2 replicas x grad-accum 1 == 1 process x grad-accum 2, step for step; then SIGINT stops every rank at
    one step with one checkpoint and no process left. Both runs get the same flags (same schedules)."""
    single_dir, multi_dir = tmp_path / "single", tmp_path / "multi"
    single = Trainer(tiny_flags(tiny_assets, single_dir, "--max-steps", "400", "--grad-accum", "2", *EXTRA))
    # the replicas trace their first step on a stand-in batch first (runtime/warmup.py; on CUDA by default,
    # here by test instrumentation): it must leave their training equal to the one process's, which does not
    multi = Trainer(
        tiny_flags(tiny_assets, multi_dir, "--max-steps", "400", *MULTI, *EXTRA), DFLASH_TEST_WARMUP="1"
    )
    pids = _worker_pids(multi)
    for t, d in ((multi, multi_dir), (single, single_dir)):
        wait_for_step(d, 4, t, timeout=180)
        if t is multi:  # what the end asserts: a drafter's tokens reached the launcher before the stop
            wait_for_record(d, "throughput record with drafter tok/s", _drafter_tok_s, t, timeout=180)
        t.signal(signal.SIGINT)
    assert multi.wait(120) == 0, multi.output
    assert single.wait(120) == 0, single.output

    s, m = steps(single_dir), steps(multi_dir)
    n = min(len(s), len(m))
    assert n >= 4
    for a, b in zip(s[:n], m[:n], strict=True):
        assert a["step"] == b["step"]
        assert a["tokens"] == b["tokens"] and a["blocks"] == b["blocks"] and a["lr"] == b["lr"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4, abs=1e-6), (a, b)
        assert b["acc"] == pytest.approx(a["acc"], abs=1e-6)

    # the stop: every rank at one step k, one checkpoint, events in order, exit 0, nothing left
    names = [e["name"] for e in events(multi_dir)]
    assert names == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"], names
    ev = {e["name"]: e for e in events(multi_dir)}
    k = ev["checkpoint_saved"]["step"]
    assert k >= 4 and ev["stopped"]["reason"] == "signal" and ev["stop_requested"]["signal"] == "SIGINT"
    assert [x["step"] for x in m] == list(range(1, k + 1))
    root = multi_dir / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{k:08d}" and checkpoint.is_complete(
        str(root / f"step_{k:08d}")
    )
    assert checkpoint.list_steps(str(root)) == [f"step_{k:08d}"]
    assert _gone(pids, multi.proc.pid), session_members(multi.proc.pid)
    # where both stopped at the same step, their checkpoints hold the same weights
    if k == len(s):
        from trainer.model import load_drafter

        wa = dict(
            load_drafter(checkpoint.latest(str(single_dir / "checkpoints")) + "/drafter")[
                0
            ].named_parameters()
        )
        wb = dict(load_drafter(checkpoint.latest(str(root)) + "/drafter")[0].named_parameters())
        assert all((wa[x] - wb[x]).abs().max().item() < 1e-4 for x in wa)

    # start-up: the one process's phases in order; the workers' relayed by the launcher, tagged by rank
    assert phases(startup(single_dir)) == [
        "compile_cache",
        "building_drafter",
        "loading_target",
        "target_loaded",
        "queue_filling",
        "first_step",
    ]
    assert phases(startup(multi_dir, rank=None)) == ["compile_cache"]  # the launcher's own
    assert phases(startup(multi_dir, rank=0)) == ["loading_target", "target_loaded"]  # target0
    for r in (1, 2):  # drafter replicas; replica 0 (the saver) writes the first step
        want = ["building_drafter", "compiling", "queue_filling"] + (["first_step"] if r == 1 else [])
        assert phases(startup(multi_dir, rank=r)) == want, startup(multi_dir, rank=r)
    for d in (single_dir, multi_dir):
        load = startup(d, phase="loading_target")
        assert load[0]["bytes"] == 0 and load[-1]["bytes"] == load[-1]["total_bytes"] > 0
        first = startup(d, phase="first_step")
        assert len(first) == 1 and first[0]["step"] == 1
        elapsed = [r["elapsed_s"] for r in startup(d)]
        assert first[0]["seconds"] == max(elapsed) > 0  # counted from the launch, for every process

    # every worker's meter reaches the launcher's metrics.jsonl
    thr = [r for r in records(multi_dir) if r["kind"] == "throughput"]
    assert thr and all([d["role"] for d in r["devices"]] == ["target", "drafter", "drafter"] for r in thr)
    assert all(r["queue"]["capacity"] == 16 for r in thr)  # --hs-queue-depth 8 on each drafter
    assert sum(d["tok_s"] for r in thr for d in r["devices"] if d["role"] == "drafter") > 0


def test_a_killed_worker_is_reported_and_the_rest_saved(tiny_assets, tmp_path):
    out = tmp_path / "run"
    t = Trainer(tiny_flags(tiny_assets, out, "--max-steps", "400", *MULTI))
    pids = _worker_pids(t)
    wait_for_step(out, 2, t, timeout=180)
    import os

    os.kill(pids[0], signal.SIGKILL)  # rank 0: the target worker
    assert t.wait(120) == 1, t.output
    ev = events(out)
    errors = [e for e in ev if e["name"] == "error"]
    assert len(errors) == 1 and errors[0]["rank"] == 0 and "rank 0 (target0 cpu" in errors[0]["message"], (
        errors
    )
    assert "SIGKILL" in errors[0]["message"]
    assert "worker rank 0 (target0 cpu" in t.output and "died: killed by SIGKILL" in t.output
    saved = [e for e in ev if e["name"] == "checkpoint_saved"]
    assert len(saved) == 1 and saved[0]["step"] >= 2
    assert checkpoint.latest(str(out / "checkpoints")) == saved[0]["path"]
    assert ev[-1]["name"] == "stopped" and ev[-1]["reason"] == "error" and ev[-1]["exit_code"] == 1
    assert _gone(pids, t.proc.pid), session_members(t.proc.pid)


def test_a_killed_launcher_takes_its_workers(tiny_assets, tmp_path):
    t = Trainer(tiny_flags(tiny_assets, tmp_path / "run", "--max-steps", "400", *MULTI))
    pids = _worker_pids(t)
    t.kill()  # SIGKILL: no handler runs; the workers' parent-death signal does the rest
    assert _gone(pids, t.proc.pid, timeout=20), [p for p in pids if session_members(t.proc.pid)]


def test_workers_under_torchrun_report_to_the_launcher(tiny_assets, tmp_path):
    """--launch torchrun: the launcher spawns nothing; torchrun (one node here, standalone rendezvous on
    localhost) starts the same workers, which connect to the launcher's control socket."""
    import os
    import subprocess
    import sys

    from tests.support.trainer_run import ROOT, env

    out = tmp_path / "run"
    flags = tiny_flags(tiny_assets, out, "--max-steps", "3", "--launch", "torchrun")
    t = Trainer(flags)
    line = t.wait_line("waiting for 2 torchrun workers: control socket ", timeout=120)
    address = line.split("control socket ", 1)[1].split()[0]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    w = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "trainer.worker", *flags],
        cwd=ROOT,
        env=env(DFLASH_CONTROL=address, GLOO_SOCKET_IFNAME="lo"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert w.returncode == 0, w.stdout + w.stderr
    assert t.wait(60) == 0, t.output
    assert [s["step"] for s in steps(out)] == [1, 2, 3]
    assert [e["name"] for e in events(out)] == ["started", "checkpoint_saving", "checkpoint_saved", "stopped"]
    thr = [r for r in records(out) if r["kind"] == "throughput"]
    assert thr and all([d["role"] for d in r["devices"]] == ["target", "drafter"] for r in thr)
