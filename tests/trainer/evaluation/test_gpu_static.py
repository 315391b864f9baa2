"""The static engine's CUDA graphs compute what its eager forward computes (fp32 on CUDA, tiny dense and hybrid
targets): target-only greedy output, speculative output with rejected drafts (the hybrid's states rolled back
from graph outputs), the drafter's proposals call after call; and ``trainer.evaluate`` picks it on CUDA.

Run on a GPU: ``PYTHONPATH=. python -m pytest tests/trainer/evaluation/test_gpu_static.py -q``. Skipped
without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.evaluation.test_spec_decode import BS, Oracle
from tests.trainer.evaluation.test_static_target import LAYERS, _prompt
from trainer.evaluation.spec_decode import speculative_generate, target_generate
from trainer.evaluation.static_target import StaticTarget

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module", params=["tiny_assets", "tiny_hybrid"])
def model(request):
    from trainer.evaluation.load import load_target_model

    return load_target_model(str(request.getfixturevalue(request.param) / "target"), "cuda:0", torch.float32)


def test_graphs_decode_as_the_eager_forward(model):
    vocab = model.config.get_text_config().vocab_size
    eager = StaticTarget(model, LAYERS, 160, graphs=False)
    graphed = StaticTarget(model, LAYERS, 160, graph_sizes=(1, BS))
    assert graphed.use_graphs
    for seed in (1, 2):
        p = _prompt(model, 70, seed)
        ref = p + target_generate(eager, p, 40).tokens
        assert target_generate(graphed, p, 40).tokens == ref[len(p) :]
        assert sorted(graphed.steps) == [1, BS] and all(graphed.steps.values())
        g = speculative_generate(graphed, Oracle(ref, 3, vocab), p, 24)
        assert g.tokens == ref[len(p) : len(p) + 24] and set(g.accept_lens) == {4}


def test_evaluate_runs_the_static_engine_with_graphs_on_cuda(tiny_hybrid, tmp_path):
    from transformers import AutoConfig

    from tests.trainer.evaluation.test_evaluate_engine import _args
    from trainer.drafting.config import DraftConfig
    from trainer.evaluation.run import evaluate
    from trainer.model import DFlashDrafter, save_drafter

    tc = AutoConfig.from_pretrained(tiny_hybrid / "target")
    cfg = DraftConfig.from_target_config(tc, num_draft_layers=1, block_size=4, target_layer_ids=LAYERS)
    save_drafter(DFlashDrafter(cfg), cfg, tmp_path)
    a = _args(tiny_hybrid, tmp_path)
    a.device = "cuda:0"
    rep = evaluate(a)
    assert rep["engine"] == "static" and rep["cuda_graphs"] is True
    assert rep["target_tok_s"] > 0 and rep["verify_steps"] > 0


def test_the_graphed_drafter_proposes_as_the_eager_one(model):
    from tests.support.model_util import tiny_drafter
    from trainer.evaluation.static_drafter import StaticProposer

    for over in ({}, {"arch": "dflash2", "dflash2": {"selector_rank": 8, "selector_top_k": 4}}):
        drafter, cfg = tiny_drafter(
            target_config=model.config, block_size=BS, target_layer_ids=LAYERS, **over
        )
        drafter = drafter.to("cuda:0")
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        a, b = StaticProposer(drafter, emb, head, 96, graphs=False), StaticProposer(drafter, emb, head, 96)
        feats = torch.randn(50, cfg.num_captured * cfg.hidden_size, device="cuda:0")
        tokens = torch.randint(0, cfg.vocab_size, (51,)).tolist()  # ids the target's embedding has
        n = 0
        for run in (30, 2, BS, 1, 5):
            ctx = tokens[: n + run + 1]
            x = a.propose(ctx, feats[n : n + run], 0.0, None).tokens.tolist()
            assert b.propose(ctx, feats[n : n + run], 0.0, None).tokens.tolist() == x
            n += run
        assert b.steps and all(b.steps.values())
