"""The per-document conv's kernel selection (trainer/target/doc_conv.py) on the CPU: the Triton kernel is never
selected here, the fast path's conv asked for it runs the reference instead, and the device self-check that
selects it on CUDA rejects a kernel that reaches across documents. The kernel itself against the reference:
tests/trainer/target/test_gpu_doc_conv.py (CUDA)."""

from __future__ import annotations

import pytest
import torch

from trainer.target import doc_conv
from trainer.target.capture import decoder_of, load_target
from trainer.target.hybrid import _conv_silu, _flat_meta, linear_in, prepare_hybrid


def test_cpu_keeps_the_shifted_taps(tiny_hybrid):
    model = load_target(str(tiny_hybrid / "target"), "cpu", torch.float32, [0, 3])
    cap = prepare_hybrid(model, fast=True, conv="triton")
    assert cap.conv == "shifted taps" and not cap.layout.conv
    assert cap.record()["conv"] == "shifted taps"
    assert not doc_conv.check("cpu", _conv_silu)
    assert doc_conv.select("cpu", _conv_silu) is None
    assert not doc_conv.usable(torch.zeros(1, 4, 8), torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="conv must be"):
        prepare_hybrid(model, fast=True, conv="cuda")


def test_linear_in_asked_for_the_kernel_on_cpu_runs_the_reference(tiny_hybrid):
    model = load_target(str(tiny_hybrid / "target"), "cpu", torch.float32, [0, 3])
    layer = decoder_of(model).layers[0]
    doc = torch.tensor([[0] * 9 + [1] + [2] * 2 + [3] * 20])
    _, _, taps = _flat_meta(doc, layer.linear_attn.conv1d.weight.shape[-1])
    h = torch.randn(1, doc.shape[1], decoder_of(model).embed_tokens.weight.shape[1])
    with torch.no_grad():
        want = linear_in(layer, h, taps, conv=None)
        for kernel in doc_conv.KERNELS:
            got = linear_in(layer, h, taps, conv=kernel)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b)


def test_check_inputs_taps_are_the_fast_paths():
    """The self-check's packed row has the taps ``_flat_meta`` gives for the same documents."""
    x, _, _, taps = doc_conv.check_inputs("cpu", 4)
    lens = (70, 1, 2, 3, 140)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).view(1, -1)
    assert x.shape[1] == doc.shape[1]
    assert torch.equal(taps, _flat_meta(doc, 4)[2])


def test_self_check_rejects_a_kernel_that_leaks_across_documents():
    def leaky(x, w, b, taps):  # every tap taken: the previous document's tokens reach the next one's start
        return _conv_silu(x, w, b, torch.ones_like(taps) & (torch.arange(taps.shape[1]) >= 3)).to(x.dtype)

    def exact(x, w, b, taps):
        return _conv_silu(x, w, b, taps).to(x.dtype)

    assert doc_conv.compare("cpu", _conv_silu, exact, 4) == (True, "")
    ok, why = doc_conv.compare("cpu", _conv_silu, leaky, 4)
    assert not ok and "max error" in why
