"""The per-document conv's Triton kernel (trainer/target/doc_conv.py) against the reference (the shifted taps,
``hybrid._conv_silu``) on CUDA: packed rows with 1-token documents, documents shorter than the width, rows
flattened (no tap into the previous row), partial tiles, widths 2-4, with and without bias, fp32 / bf16 /
fp16, eager and inside a compiled region, both kernels (the tile one for any taps, the rolling one's packed-row
variant the capture prefers); the self-check selects the rolling kernel (the tile one past its widest conv) and
``prepare_hybrid`` uses it; a tiny hybrid target's capture is the same with either conv.

Run on a GPU: ``PYTHONPATH=. python -m pytest tests/trainer/target/test_gpu_doc_conv.py -q``. Skipped without
CUDA or Triton."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from trainer.target import doc_conv
from trainer.target.capture import capture, load_target
from trainer.target.hybrid import _conv_silu, _flat_meta, prepare_hybrid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not doc_conv.triton_available(), reason="needs Triton"),
]
DEV = "cuda"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _packed(rows, K: int):
    """doc ids (B, T) of ``rows`` (document lengths per row; right padding -1) and the fast path's taps."""
    T = max(sum(r) for r in rows)
    doc = torch.full((len(rows), T), -1)
    for b, lens in enumerate(rows):
        s = 0
        for i, n in enumerate(lens):
            doc[b, s : s + n] = i
            s += n
    return doc, _flat_meta(doc, K)[2].to(DEV)


def _err(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("C", [6, 200, 2048])
@pytest.mark.parametrize("kernel", ["tile", "rolling"])
def test_kernel_equals_the_shifted_taps(K, dtype, C, kernel):
    doc, taps = _packed([(1, 2, 3, 64, 1, 200), (300, 5, 1)], K)
    N = doc.numel()
    g = torch.Generator(device=DEV).manual_seed(K * C)
    x = torch.randn(1, N, C, device=DEV, generator=g).to(dtype)
    w = torch.randn(C, K, device=DEV, generator=g).to(dtype)
    b = torch.randn(C, device=DEV, generator=g).to(dtype)
    for bias in (b, None):
        got = doc_conv.KERNELS[kernel][0](x, w, bias, taps)
        want = _conv_silu(x, w, bias, taps).to(dtype)
        assert got.dtype == dtype and got.shape == x.shape
        assert _err(got, want) <= TOL[dtype], (K, dtype, C, bias is None)


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("tile", [(256, 512, 4, 2), (7, 64, 4, 1), (64, 1024, 8, 3)])
@pytest.mark.parametrize("reset", [False, True])
def test_the_rolling_kernel_equals_the_shifted_taps(K, tile, reset):
    """The second kernel and its reset variant (bench/hybrid_conv.py's sweep times them): an odd strip, a
    partial channel tile, documents of 1 token and shorter than K at strip edges."""
    doc, taps = _packed([(1, 2, 3, 64, 1, 200), (300, 5, 1)], K)
    N, C = doc.numel(), 2100
    g = torch.Generator(device=DEV).manual_seed(K)
    x = torch.randn(1, N, C, device=DEV, generator=g).to(torch.bfloat16)
    w = torch.randn(C, K, device=DEV, generator=g).to(torch.bfloat16)
    b = torch.randn(C, device=DEV, generator=g).to(torch.bfloat16)
    bt, bc, warps, stages = tile
    for bias in (b, None):
        got = doc_conv.launch_rolling(x, w, bias, taps, bt, bc, warps, stages, reset)
        want = _conv_silu(x, w, bias, taps).to(torch.bfloat16)
        assert _err(got, want) <= TOL[torch.bfloat16], (K, tile, reset, bias is None)


@pytest.mark.parametrize("kernel", ["tile", "rolling"])
def test_kernel_in_a_compiled_region_and_on_a_strided_input(kernel):
    conv = doc_conv.KERNELS[kernel][0]
    doc, taps = _packed([(1000, 1, 3, 2000)], 4)
    N, C = doc.numel(), 2048 * 3
    x = torch.randn(1, N, C, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(C, 4, device=DEV, dtype=torch.bfloat16)

    def region(x, w, taps):  # as linear_in does: q / k / v by column slices of one projection's output
        q, v = x[..., :2048], x[..., 2048:]
        return conv(q, w[:2048], None, taps), conv(v, w[2048:], None, taps)

    got = torch.compile(region)(x, w, taps)
    want = (_conv_silu(x[..., :2048], w[:2048], None, taps), _conv_silu(x[..., 2048:], w[2048:], None, taps))
    for a, b in zip(got, want, strict=True):
        assert _err(a, b.to(torch.bfloat16)) <= TOL[torch.bfloat16]


def test_select_prefers_the_rolling_kernel_and_takes_the_tile_one_past_its_width():
    assert doc_conv.select(DEV, _conv_silu, 4) == "rolling"
    assert doc_conv.select(DEV, _conv_silu, doc_conv.ROLLING_MAX_K + 1) == "tile"


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention")
def test_prepare_hybrid_selects_it_and_the_capture_is_the_same(tiny_hybrid):
    assert doc_conv.check(DEV, _conv_silu, 4)
    layers = [0, 3, 5, 7]
    model = load_target(str(tiny_hybrid / "target"), DEV, torch.bfloat16, layers)
    doc, _ = _packed([(200, 3, 1, 70, 130)], 4)
    ids = torch.randint(0, 120, doc.shape, generator=torch.Generator().manual_seed(0)).to(DEV)
    cap = prepare_hybrid(model, fast=True, compile=False, conv="torch")
    assert cap.conv == "shifted taps"
    want, _ = capture(model, ids, doc, layers)
    cap = prepare_hybrid(model, fast=True, compile=False)
    assert cap.conv == "triton rolling" and cap.layout.conv == "rolling"
    got, _ = capture(model, ids, doc, layers)
    assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention")
def test_the_kernel_is_chosen_where_the_target_is_built_not_beside_a_compile(tiny_hybrid, monkeypatch):
    """The trainer reads a target's weights in a thread while the drafter's first step compiles; torch's
    FX-tracing flag is process-wide, so a check compiled there was refused and the capture fell back (seen on
    an H200, 2026-12-04). The flag set all through ``finish`` stands for that compile: the choice is made
    before, by ``begin_target``."""
    from torch.fx import _symbolic_trace

    from trainer.target.capture import begin_target, capture_of

    doc_conv._selected.clear()
    pending = begin_target(str(tiny_hybrid / "target"), DEV, torch.bfloat16, [0, 3])
    monkeypatch.setattr(_symbolic_trace, "_is_fx_tracing_flag", True)
    model = pending.finish()
    monkeypatch.undo()
    assert capture_of(model).conv == "triton rolling"
