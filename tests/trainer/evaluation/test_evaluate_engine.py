"""``trainer.evaluate --engine``: the static engine (the GPU default) decodes a hybrid target exactly as the
cache engine does (every prompt's acceptance, the greedy check), the report says which ran, and an engine
that cannot run is refused with the reason."""

from __future__ import annotations

import pytest
import torch

from trainer.evaluation.load import EvalError
from trainer.evaluation.run import build_parser, evaluate


@pytest.fixture(scope="module")
def drafter_dir(tiny_hybrid, tmp_path_factory):
    from transformers import AutoConfig

    from trainer.drafting.config import DraftConfig
    from trainer.model import DFlashDrafter, save_drafter

    tc = AutoConfig.from_pretrained(tiny_hybrid / "target")
    cfg = DraftConfig.from_target_config(tc, num_draft_layers=1, block_size=4, target_layer_ids=[1, 3])
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("drafter")
    save_drafter(DFlashDrafter(cfg), cfg, out)
    return out


def _args(assets, drafter, *extra):
    return build_parser().parse_args(
        ["--target-model", str(assets / "target"), "--drafter", str(drafter), "--prompts", str(assets / "data"),
         "--num-prompts", "3", "--max-new-tokens", "16", "--device", "cpu", *extra]
    )  # fmt: skip


def test_static_and_cache_engines_decode_alike(tiny_hybrid, drafter_dir):
    reps = {e: evaluate(_args(tiny_hybrid, drafter_dir, "--engine", e)) for e in ("static", "cache")}
    s, c = reps["static"], reps["cache"]
    assert (s["engine"], c["engine"]) == ("static", "cache")
    assert s["cuda_graphs"] is False and c["cuda_graphs"] is None  # the CPU runs the static steps eagerly
    assert s["greedy_match"] is True and c["greedy_match"] is True
    assert s["prompt_accept_len"] == c["prompt_accept_len"] and s["prompt_steps"] == c["prompt_steps"]
    assert s["histogram"] == c["histogram"] and s["rewind_forwards"] == 0
    # auto on the CPU keeps the cache engine
    assert evaluate(_args(tiny_hybrid, drafter_dir, "--num-prompts", "1"))["engine"] == "cache"


def test_an_engine_that_cannot_run_is_refused(tiny_hybrid, drafter_dir):
    with pytest.raises(EvalError, match="--engine static: --rewind replay needs the cache engine"):
        evaluate(_args(tiny_hybrid, drafter_dir, "--engine", "static", "--rewind", "replay"))
