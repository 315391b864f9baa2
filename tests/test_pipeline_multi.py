"""The multi-process pipeline on CPU (gloo on loopback): 1 target + 2 drafter workers and their launcher.

Real processes, real signals: DDP replicas compute what one process with the same total grad-accum does;
SIGINT stops every rank with one checkpoint; a SIGKILLed worker is reported and what can be saved is; a
SIGKILLed launcher takes its workers with it.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.trainer_run import Trainer, events, records, session_members, steps, tiny_flags, wait_for_step
from trainer import checkpoint

pytestmark = pytest.mark.slow

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


def test_two_ddp_replicas_match_one_process_with_grad_accum_2(tiny_assets, tmp_path):
    n = 5
    single = Trainer(tiny_flags(tiny_assets, tmp_path / "single", "--max-steps", str(n), "--grad-accum", "2", *EXTRA))
    multi = Trainer(tiny_flags(tiny_assets, tmp_path / "multi", "--max-steps", str(n), *MULTI, *EXTRA))
    assert multi.wait(240) == 0, multi.output
    assert single.wait(240) == 0, single.output
    s, m = steps(tmp_path / "single"), steps(tmp_path / "multi")
    assert [r["step"] for r in m] == list(range(1, n + 1)) == [r["step"] for r in s]
    for a, b in zip(s, m, strict=True):
        assert a["tokens"] == b["tokens"] and a["blocks"] == b["blocks"] and a["lr"] == b["lr"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4, abs=1e-6), (a, b)
        assert b["acc"] == pytest.approx(a["acc"], abs=1e-6)
    assert m[-1]["loss"] < m[0]["loss"]
    # the same final weights (the checkpoints are interchangeable)
    from trainer.export import load_drafter

    wa = dict(load_drafter(checkpoint.latest(str(tmp_path / "single" / "checkpoints")) + "/drafter")[0].named_parameters())
    wb = dict(load_drafter(checkpoint.latest(str(tmp_path / "multi" / "checkpoints")) + "/drafter")[0].named_parameters())
    for k in wa:
        assert (wa[k] - wb[k]).abs().max().item() < 1e-4, k
    # every worker's meter reaches the launcher's metrics.jsonl
    thr = [r for r in records(tmp_path / "multi") if r["kind"] == "throughput"]
    assert thr and all([d["role"] for d in r["devices"]] == ["target", "drafter", "drafter"] for r in thr)
    assert all(r["queue"]["capacity"] == 16 for r in thr)  # --hs-queue-depth 8 on each drafter
    assert sum(d["tok_s"] for r in thr for d in r["devices"] if d["role"] == "drafter") > 0
    assert [e["name"] for e in events(tmp_path / "multi")] == [
        "started", "checkpoint_saving", "checkpoint_saved", "stopped"]


def test_sigint_stops_every_rank_with_one_checkpoint(tiny_assets, tmp_path):
    out = tmp_path / "run"
    t = Trainer(tiny_flags(tiny_assets, out, "--max-steps", "400", *MULTI))
    pids = _worker_pids(t)
    wait_for_step(out, 2, t, timeout=180)
    t.signal(signal.SIGINT)
    assert t.wait(120) == 0, t.output
    names = [e["name"] for e in events(out)]
    assert names == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"], names
    ev = {e["name"]: e for e in events(out)}
    k = ev["checkpoint_saved"]["step"]
    assert k >= 2 and ev["stopped"]["reason"] == "signal"
    assert [s["step"] for s in steps(out)] == list(range(1, k + 1))  # all ranks stopped at step k
    root = out / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{k:08d}" and checkpoint.is_complete(str(root / f"step_{k:08d}"))
    assert checkpoint.list_steps(str(root)) == [f"step_{k:08d}"]
    assert _gone(pids, t.proc.pid), session_members(t.proc.pid)


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
    assert errors and errors[0]["rank"] == 0 and "rank 0 (target0 cpu" in errors[0]["message"]
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
