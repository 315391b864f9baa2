"""The pipeline's GPU side without per-micro-batch host syncs: ``GpuMeter``, ``TargetRole.run``, short real runs.

Run on a GPU machine: ``PYTHONPATH=. python -m pytest tests/trainer/runtime/test_gpu_pipeline.py -q``. Skipped without CUDA.
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from tests.support.trainer_run import ROOT, env, tiny_flags
from trainer.data.dataset import Plan, load_dir
from trainer.runtime.gpu_meter import GpuMeter, role_meter
from trainer.runtime.roles import TargetRole
from trainer.target.capture import load_target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEV = "cuda:0"


def _work(a, n):
    for _ in range(n):
        a = torch.tanh(a @ a)  # tanh keeps the values finite
    return a


def test_gpu_meter_counts_tokens_when_the_gpu_is_done_and_splits_busy_time():
    a = torch.randn(16384, 16384, device=DEV, dtype=torch.bfloat16)  # few long kernels: the launch queue
    _work(a, 2)  # (about 1,000 kernels) never fills, which would make the host wait
    torch.cuda.synchronize()
    n = 4
    while True:  # calibrate: enough work for about 0.4 s
        t = time.monotonic()
        _work(a, n)
        torch.cuda.synchronize()
        dt = time.monotonic() - t
        if dt > 0.3:
            break
        n = int(n * 0.45 / max(dt, 1e-3)) + 1

    m = GpuMeter(DEV, "drafter")
    m.take(time.monotonic())  # opens the first interval
    t0 = time.monotonic()
    m.begin()
    _work(a, n)
    m.end(123)
    assert time.monotonic() - t0 < dt / 3  # the host did not wait for the GPU
    time.sleep(dt / 3)
    tok1, busy1 = m.take(time.monotonic())
    assert tok1 == 0  # still running: no tokens yet
    assert 0.15 * dt < busy1 < 0.5 * dt + 0.05  # the part of the span so far
    torch.cuda.synchronize()
    time.sleep(0.2)  # an idle stretch after the span: not busy
    tok2, busy2 = m.take(time.monotonic())
    assert tok2 == 123
    assert abs((busy1 + busy2) - dt) < 0.15 * dt  # the span's GPU time, split over the two intervals
    assert m.take(time.monotonic()) == (0, 0.0)  # nothing counted twice


@pytest.fixture(scope="module")
def tiny_target(tiny_assets):
    from trainer.runtime.common import quiet_transformers

    quiet_transformers()
    model = load_target(str(tiny_assets / "target"), DEV, torch.bfloat16, [1, 3])
    plan = Plan(
        load_dir(str(tiny_assets / "data"), 256), seed=0, epochs=1, token_budget=1024, max_batch_size=4
    )
    return model, plan


def test_target_run_yields_complete_batches_in_order_one_launch_ahead(tiny_target):
    model, plan = tiny_target
    meter = role_meter(DEV, "target")
    assert isinstance(meter, GpuMeter)
    role = TargetRole(model, DEV, [1, 3], False, meter)
    gs = list(range(min(plan.total, 8)))
    meter.take(time.monotonic())
    got = []
    for hb in role.run(plan, gs):
        assert hb.ready.query()  # complete when handed on
        got.append(hb)
    assert [hb.index for hb in got] == gs
    for hb in got:
        ref = role(plan.batch(hb.index))
        assert torch.allclose(hb.hidden.float(), ref.hidden.float(), atol=2e-2, rtol=0)
    torch.cuda.synchronize()
    tokens, _ = meter.take(time.monotonic())
    assert tokens == sum(hb.tokens for hb in got) * 2  # run's and the per-call references


def _gpu_run(tiny_assets, tmp_path, tgpus, dgpus):
    out = tmp_path / f"run_{tgpus}_{dgpus}"
    flags = tiny_flags(tiny_assets, out, "--max-steps", "12", "--log-every", "1")
    flags[flags.index("--target-gpus") + 1] = tgpus
    flags[flags.index("--drafter-gpus") + 1] = dgpus
    p = subprocess.run(
        [sys.executable, "-m", "trainer.pipeline", *flags],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert all(s["loss"] == s["loss"] for s in steps)
    thr = [r for r in recs if r["kind"] == "throughput"]
    seen = {d["role"]: 0 for r in thr for d in r["devices"]}
    for r in thr:
        for d in r["devices"]:
            assert 0.0 <= d["busy"] <= 1.0
            seen[d["role"]] += d["tok_s"] > 0
    assert seen.get("target", 0) > 0 and seen.get("drafter", 0) > 0  # both GPU meters counted tokens
    return steps


def test_one_gpu_run_trains_and_meters_both_roles(tiny_assets, tmp_path):
    _gpu_run(tiny_assets, tmp_path, "0", "0")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpu_run_trains_and_meters_both_roles(tiny_assets, tmp_path):
    _gpu_run(tiny_assets, tmp_path, "0", "1")


def test_gpu_meter_without_a_reporter_keeps_few_events(monkeypatch):
    from trainer.runtime import gpu_meter

    monkeypatch.setattr(gpu_meter, "MAX_PENDING", 4)
    m = GpuMeter(DEV, "target")
    a = torch.randn(1024, 1024, device=DEV)
    for _ in range(20):
        m.begin()
        _work(a, 2)
        m.end(10)
        torch.cuda.synchronize()
    assert len(m._spans) <= 5  # finished spans folded in, not kept
    assert m.take(time.monotonic())[0] == 200  # and not lost
