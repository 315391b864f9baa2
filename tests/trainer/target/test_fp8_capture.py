"""Hidden states captured from an FP8 checkpoint (the tiny targets' projections quantised in Qwen's block-128
layout, saved with safetensors) against the unquantised target's, per captured layer, on every capture path:
hooks and the direct loop (dense Qwen3), both hybrid layouts (Qwen3.5); packed documents still equal
themselves alone. Run with ``-s`` to see the per-layer relative errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.target.fp8_ref import rel, write_fp8
from trainer.evaluation.load import load_target_model
from trainer.target.capture import (
    capture,
    capture_of,
    decoder_of,
    load_target,
    prepare_capture,
    prepare_hybrid,
)
from trainer.target.fp8 import Fp8Linear

LENS = (40, 3, 1, 30)
BOUND = 0.08  # e4m3 weights: a few percent per layer on these random targets


def _row(vocab: int = 120):
    ids = torch.randint(0, vocab, (1, sum(LENS)), generator=torch.Generator().manual_seed(0))
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(LENS)]).view(1, -1)
    return ids, doc


def _per_layer(got, want, layers) -> list[float]:
    H = want.shape[-1] // len(layers)
    return [rel(got[..., i * H : (i + 1) * H], want[..., i * H : (i + 1) * H]) for i in range(len(layers))]


def _table(layers, errs) -> dict[int, float]:
    return {i: round(e, 4) for i, e in zip(layers, errs, strict=True)}


def _check(name: str, fp8_model, ref_model, layers, doc_alone: bool = True) -> list[float]:
    """Per captured layer: the relative error of the hidden state, and of what the layers added to the
    embedding (the tiny targets' embeddings are large: the first alone understates the layers' error)."""
    ids, doc = _row()
    got, _ = capture(fp8_model, ids, doc, layers)
    want, _ = capture(ref_model, ids, doc, layers)
    emb = decoder_of(ref_model).embed_tokens(ids).detach().repeat(1, 1, len(layers))
    errs, added = _per_layer(got, want, layers), _per_layer(got - emb, want - emb, layers)
    print(f"\n{name}: relative error per captured layer {_table(layers, errs)}")
    print(f"{name}: of the layers' part (h - embedding) {_table(layers, added)}")
    assert all(0 < e < BOUND for e in errs + added), (errs, added)
    if doc_alone:  # packing: each document of the row = that document captured alone
        s = 0
        for n in LENS:
            alone, _ = capture(fp8_model, ids[:, s : s + n], torch.zeros(1, n), layers)
            assert rel(got[:, s : s + n], alone) < 1e-5, n
            s += n
    return errs


@pytest.fixture(scope="module")
def dense(tiny_assets, tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8-dense")
    write_fp8(str(tiny_assets / "target"), str(path))
    return str(tiny_assets / "target"), str(path)


def test_dense_fp8_capture_is_close_to_the_unquantised_one(dense):
    plain, fp8 = dense
    layers = [0, 2, 5]
    ref = load_target(plain, "cpu", torch.float32, layers)
    model = load_target(fp8, "cpu", torch.float32, layers)
    assert isinstance(model.model.layers[0].self_attn.q_proj, Fp8Linear)
    assert capture_of(model).kind == "hooks"
    hooks = _check("dense, hooks", model, ref, layers, doc_alone=False)
    for m in (model, ref):
        assert prepare_capture(m, attn="sdpa", compile=False) == "sdpa"
    direct = _check("dense, direct", model, ref, layers)
    assert max(abs(a - b) for a, b in zip(hooks, direct, strict=True)) < 1e-4


@pytest.mark.parametrize(
    ("kind", "fast"), [("tiny_hybrid", False), ("tiny_hybrid", True), ("tiny_hybrid_moe", True)]
)
def test_hybrid_fp8_capture_is_close_to_the_unquantised_one(kind, fast, request, tmp_path):
    """Dense and MoE (the per-expert FP8 weights dequantised into the fused experts, the shared expert FP8)."""
    layers = [1, 3, 4, 7]  # GDN and attention layers
    target = request.getfixturevalue(kind) / "target"
    write_fp8(str(target), str(tmp_path / "fp8"))
    ref = load_target(str(target), "cpu", torch.float32, layers)
    model = load_target(str(tmp_path / "fp8"), "cpu", torch.float32, layers)
    layer = model.model.layers[0]
    assert (
        isinstance(layer.linear_attn.in_proj_qkv, Fp8Linear)
        and type(layer.linear_attn.in_proj_a) is nn.Linear
    )
    mlp = layer.mlp.shared_expert if kind == "tiny_hybrid_moe" else layer.mlp
    assert isinstance(mlp.down_proj, Fp8Linear)
    for m in (model, ref):
        prepare_hybrid(m, fast=fast, compile=False)
    _check(f"{kind}, {'flattened' if fast else 'rows'}", model, ref, layers)


def test_evaluation_reads_an_fp8_target_whole(dense):
    plain, fp8 = dense
    model = load_target_model(fp8, "cpu", torch.float32)
    ref = load_target_model(plain, "cpu", torch.float32)
    assert isinstance(model.model.layers[0].mlp.down_proj, Fp8Linear)
    assert model.generation_config.eos_token_id == ref.generation_config.eos_token_id
    ids, _ = _row()
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert 0 < rel(got, want) < BOUND
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.9
