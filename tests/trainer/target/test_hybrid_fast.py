"""The fast hybrid path (flattened rows, compiled regions on CUDA; here on CPU, eager, plain-PyTorch rule)
against the hook path (transformers' own layers): on one-document rows it is the same function, and on
packed rows each document equals that document alone."""

from __future__ import annotations

import pytest
import torch

from trainer.target.base import attach
from trainer.target.capture import capture, load_target
from trainer.target.hybrid import _conv_silu, _flat_meta, causal_conv_docs, prepare_hybrid

LAYERS = [0, 3, 4, 7]  # GDN and attention layers, up to the last of the 8


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def _hook_model(path):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    attach(ref, None)  # the hook path
    return ref


def _fast(path):
    model = load_target(str(path), "cpu", torch.float32, LAYERS, need_final_hidden=True)
    st = prepare_hybrid(model, fast=True)
    assert st.fast and st.linear == "torch" and not st.compiled
    return model


@pytest.mark.parametrize("kind", ["tiny_hybrid", "tiny_hybrid_moe"])
def test_fast_path_equals_hook_path_on_one_document_rows(kind, request):
    target = request.getfixturevalue(kind) / "target"
    ref, model = _hook_model(target), _fast(target)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 120, (2, 70), generator=g)  # two rows, one document each (> one 64-token chunk)
    doc = torch.zeros(2, 70, dtype=torch.long)
    want, want_final = capture(ref, ids, doc, LAYERS, need_final_hidden=True)
    got, got_final = capture(model, ids, doc, LAYERS, need_final_hidden=True)
    assert got.shape == want.shape and got_final.shape == want_final.shape
    assert _rel(got, want) < 1e-5 and _rel(got_final, want_final) < 1e-5


def test_fast_path_packed_rows_equal_each_document_alone(tiny_hybrid):
    target = tiny_hybrid / "target"
    ref, model = _hook_model(target), _fast(target)
    g = torch.Generator().manual_seed(2)
    rows = [(40, 3, 1, 30), (2, 66, 1, 5)]  # 1 token, shorter and longer than the conv width, > a chunk
    T = 76
    ids = torch.randint(0, 120, (2, T), generator=g)
    doc = torch.full((2, T), -1)  # right padding
    for b, lens in enumerate(rows):
        s = 0
        for i, n in enumerate(lens):
            doc[b, s : s + n] = i
            s += n
    got, final = capture(model, ids, doc, LAYERS, need_final_hidden=True)
    for b, lens in enumerate(rows):
        s = 0
        for n in lens:
            alone, alone_final = capture(ref, ids[b : b + 1, s : s + n], torch.zeros(1, n), LAYERS, True)
            assert _rel(got[b : b + 1, s : s + n], alone) < 1e-5, (b, n)
            assert _rel(final[b : b + 1, s : s + n], alone_final) < 1e-5, (b, n)
            s += n


def test_masked_tap_conv_equals_per_document_conv():
    """The fast path's conv (shifted taps masked by 'same document', rows flattened) equals the per-row
    per-document conv, at the row starts too (no tap reaches into the previous row)."""
    g = torch.Generator().manual_seed(3)
    doc = torch.tensor([[0, 0, 0, 0, 0, 1, 2, 2, 3, 3], [0, 1, 1, 1, 1, 1, 1, 2, -1, -1]])
    x = torch.randn(2, 10, 6, generator=g)
    w = torch.randn(6, 4, generator=g)
    bias = torch.randn(6, generator=g)
    _, _, taps = _flat_meta(doc, 4)
    got = _conv_silu(x.reshape(1, 20, 6), w, bias, taps).view(2, 10, 6)
    want = torch.nn.functional.silu(causal_conv_docs(x, w, bias, doc))
    assert torch.allclose(got, want, atol=1e-6)
