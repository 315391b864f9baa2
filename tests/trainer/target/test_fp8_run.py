"""The real tiny trainer on the CPU with an FP8 target (its projections in Qwen's block-128 layout): it
trains and saves, its target loaded as FP8 (the bytes the start-up reports are the FP8 model's), and
``--target-dtype bf16`` runs the same checkpoint dequantised, ``--fp8-scales row`` requantised per row."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.support.trainer_run import run, tiny_flags
from tests.trainer.target.fp8_ref import write_fp8
from trainer.target.capture import load_target

pytestmark = pytest.mark.e2e  # each test starts a real process

LAYERS = [1, 3]


def _loaded_bytes(out) -> int:
    with open(out / "metrics.jsonl") as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    return next(r["bytes"] for r in rows if r.get("phase") == "target_loaded")


@pytest.mark.parametrize(("target_dtype", "scales"), [(None, None), ("bf16", None), (None, "row")])
def test_the_tiny_trainer_runs_an_fp8_target(tiny_assets, tmp_path, target_dtype, scales):
    tiny = tmp_path / "tiny"
    write_fp8(str(tiny_assets / "target"), str(tiny / "target"))
    shutil.copytree(tiny_assets / "data", tiny / "data")
    extra = ("--max-steps", "2", "--target-layer-ids", ",".join(map(str, LAYERS)))
    if target_dtype is not None:
        extra += ("--target-dtype", target_dtype)
    if scales is not None:
        extra += ("--fp8-scales", scales)
    rc, output = run(tiny_flags(tiny, tmp_path / "out", *extra), timeout=120)
    assert rc == 0, output
    assert "stopped: finished" in output
    model = load_target(
        str(tiny / "target"), "cpu", torch.float32, LAYERS, target_dtype=target_dtype, fp8_scales=scales
    )
    want = sum(p.numel() * p.element_size() for p in model.parameters())
    plain = load_target(str(tiny_assets / "target"), "cpu", torch.float32, LAYERS)
    fp32 = sum(p.numel() * p.element_size() for p in plain.parameters())
    assert _loaded_bytes(tmp_path / "out") == want
    assert (want < fp32) == (target_dtype is None)
