"""The drafter's first step traced on a stand-in batch while the target loads (trainer/runtime/warmup.py,
issue 22): the stand-in has the shapes, dtypes and data of the batch the target then captures, and a run
that traced it trains bit for bit as one that did not (no gradient, generator or RNG state left behind)."""

import json
import signal

import torch

from tests.support.trainer_run import tiny_flags
from trainer import pipeline
from trainer.data.dataset import Plan, load_dir
from trainer.run.flags import build_parser
from trainer.run.settings import resolve
from trainer.runtime import warmup
from trainer.runtime.common import draft_config
from trainer.runtime.gpu_meter import role_meter
from trainer.runtime.roles import TargetRole
from trainer.target.capture import load_target


def test_stand_in_batch_has_the_shapes_of_the_capture(tiny_assets, tmp_path):
    args = resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "run", "--seed", "3")))
    ds = load_dir(args.data_dir, args.max_seq_len)
    plan = Plan.from_flags(ds, args)
    cfg = draft_config(args)
    model = load_target(args.target_model, "cpu", torch.float32, cfg.target_layer_ids, need_final_hidden=True)
    role = TargetRole(model, "cpu", cfg.target_layer_ids, True, role_meter("cpu", "target"))
    for g in (0, 5):
        real = role(plan.batch(g))
        fake = warmup.stand_in_batch(plan, g, cfg, "cpu", torch.float32, need_final=True)
        for name in ("hidden", "final", "input_ids", "loss_mask", "doc_ids"):
            r, f = getattr(real, name), getattr(fake, name)
            assert (r.shape, r.dtype, r.stride(), r.device) == (f.shape, f.dtype, f.stride(), f.device), name
        for name in ("input_ids", "loss_mask", "doc_ids"):
            assert torch.equal(getattr(real, name), getattr(fake, name)), name
        assert (real.index, real.epoch, real.tokens) == (fake.index, fake.epoch, fake.tokens)


def _train(tiny_assets, out, monkeypatch, capfd, traced: bool) -> tuple[list, dict]:
    if traced:  # on the CPU nothing compiles, so the trace is off: test instrumentation runs the same code
        monkeypatch.setattr(warmup, "testing", lambda: True)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = pipeline.main(
            tiny_flags(tiny_assets, out, "--max-steps", "3", "--use-soft-labels", "--seed", "5")
        )
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        monkeypatch.undo()
    assert rc == 0
    with open(out / "metrics.jsonl") as f:
        steps = [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if r["kind"] == "step"]
    ckpt = sorted((out / "checkpoints").glob("step_*"))[-1]
    state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    from safetensors.torch import load_file

    weights = load_file(str(ckpt / "drafter" / "model.safetensors"))
    return steps, {"weights": weights, "state": state, "log": "".join(capfd.readouterr())}


def test_a_traced_first_step_leaves_training_bit_exact(tiny_assets, tmp_path, monkeypatch, capfd):
    plain_steps, plain = _train(tiny_assets, tmp_path / "plain", monkeypatch, capfd, traced=False)
    traced_steps, traced = _train(tiny_assets, tmp_path / "traced", monkeypatch, capfd, traced=True)
    assert "traced on a stand-in" not in plain["log"]
    assert "drafter step traced on a stand-in of micro-batch 0" in traced["log"]
    assert traced_steps == plain_steps and len(plain_steps) == 3
    for k, v in plain["weights"].items():
        assert torch.equal(traced["weights"][k], v), k
    for k in ("generator", "torch", "python"):
        a, b = plain["state"]["rng"][k], traced["state"]["rng"][k]
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, k
