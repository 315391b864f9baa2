"""The block-128 e4m3 layout (trainer/target/fp8.py) against the tests' own block-by-block reference
(fp8_ref.py): quantise-on-load, dequantisation, the reference and FP8-activation matmuls, row slices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.target.fp8_ref import ref_dequantise, ref_quantise, rel
from trainer.target import fp8

SHAPES = [(300, 200), (128, 128), (1, 5), (129, 257), (256, 384)]


def _weights(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 0.05
    w[0, 0] = 3.0  # an outlier: its block's scale is large, its small values go subnormal
    if shape[0] > 128 and shape[1] > 128:
        w[128:256, 128:256] = 0.0  # an all-zero block
    return w


@pytest.mark.parametrize("shape", SHAPES)
def test_quantise_matches_the_block_by_block_reference(shape):
    w = _weights(shape)
    q, s = fp8.quantise(w)
    rq, rs = ref_quantise(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == fp8.scale_shape(*shape) == rs.shape
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(fp8.dequantise(q, s), ref_dequantise(rq, rs))


@pytest.mark.parametrize("shape", SHAPES)
def test_quantise_round_trip_error_is_bounded(shape):
    """e4m3 keeps 3 mantissa bits: a normal value is off by at most 2^-4 of itself, a subnormal one (below
    2^-6 of its block's scale) by at most 2^-10 of the scale; zero blocks come back exact."""
    w = _weights(shape, seed=1)
    q, s = fp8.quantise(w)
    back = fp8.dequantise(q, s)
    bound = torch.maximum(w.abs() / 16, fp8.expand_scale(s, shape) / 1024) * (1 + 1e-6)
    err = (back - w).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    assert rel(back, w) < 0.04
    if shape[0] > 128 and shape[1] > 128:
        assert not back[128:256, 128:256].any()


def test_fp8_linear_reference_forward_and_row_slices():
    lin = nn.Linear(256, 448, bias=True).requires_grad_(False)
    m = fp8.Fp8Linear.from_linear(lin)
    assert m.weight.dtype == torch.float8_e4m3fn and not m.fast  # 256 / 128 = 2 column blocks: not 4-aligned
    x = torch.randn(3, 5, 256)
    want = x @ ref_dequantise(*ref_quantise(lin.weight.detach())).t() + lin.bias.detach()
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    assert rel(m(x), lin(x)) < 0.05
    for spans in (((0, 128), (128, 128), (256, 192)), ((0, 100), (100, 348))):  # block-aligned or not
        got = m.forward_rows(x, spans)
        for (s, n), y in zip(spans, got, strict=True):
            torch.testing.assert_close(y, m(x)[..., s : s + n], rtol=1e-6, atol=1e-6)


def _ref_quantise_rows(x2: torch.Tensor):
    """Per token and 128-column group: scale = amax / 448."""
    M, K = x2.shape
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, K // 128)
    for i in range(M):
        for j in range(K // 128):
            g = x2[i, j * 128 : (j + 1) * 128].float()
            s[i, j] = g.abs().max() / 448.0
            q[i, j * 128 : (j + 1) * 128] = (g / s[i, j]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def test_fp8_activation_matmul_as_the_gpu_runs_it():
    """The GPU path's activation quantisation (1 x 128 groups) and the op's emulating CPU kernel: the same
    numbers as the reference built here, within e4m3's error of the fp32 matmul."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(384, 512, generator=g) * 0.05
    q, s = fp8.quantise(w)
    x = torch.randn(2, 7, 512, generator=g)
    xq, xs = fp8.quantise_input(x.reshape(-1, 512))
    rq, rs = _ref_quantise_rows(x.reshape(-1, 512))
    assert torch.equal(xs, rs) and torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    xd = (rq.float().view(14, 4, 128) * rs.unsqueeze(-1)).view(14, 512)
    want = (xd @ ref_dequantise(q, s).t()).view(2, 7, 384)
    got = fp8.block_linear(x, q, s)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert 0 < rel(got, x @ w.t()) < 0.06
    rows = fp8.block_linear_many(x, [(q[:128], s[:1]), (q[128:], s[1:])], [None, None])
    torch.testing.assert_close(torch.cat(rows, -1), got, rtol=1e-6, atol=1e-6)


def test_the_gpu_branch_of_the_module_on_the_ops_cpu_kernel(monkeypatch):
    """Fp8Linear's FP8 branch (forward, forward_rows' weight and scale row slices, the bias) run on the CPU
    through the op's emulating kernel: as the reference built here from the quantised activations."""
    lin = nn.Linear(512, 448, bias=True).requires_grad_(False)
    m = fp8.Fp8Linear.from_linear(lin)
    assert m.fast
    monkeypatch.setattr(fp8.Fp8Linear, "_on_fp8", lambda self, x: self.fast)
    x = torch.randn(2, 9, 512, generator=torch.Generator().manual_seed(3))
    rq, rs = _ref_quantise_rows(x.reshape(-1, 512))
    xd = (rq.float().view(18, 4, 128) * rs.unsqueeze(-1)).view(2, 9, 512)
    want = xd @ ref_dequantise(*ref_quantise(lin.weight)).t() + lin.bias
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    spans = ((0, 128), (128, 256), (384, 64))  # block-aligned, the last one the tail
    for (s, n), y in zip(spans, m.forward_rows(x, spans), strict=True):
        torch.testing.assert_close(y, want[..., s : s + n], rtol=1e-5, atol=1e-5)
    # traced as a compiled region traces it (the op through its fake kernel; no C++ compiler needed here)
    traced = torch.compile(lambda h: [m(h), *m.forward_rows(h, spans)], backend="aot_eager", fullgraph=True)
    for got, ref in zip(traced(x), [m(x), *m.forward_rows(x, spans)], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_a_block_layer_cublas_refuses_rounds_its_activations_on_cuda_only(monkeypatch):
    """K = 384 (3 blocks: cuBLAS's block-scaled matmul refuses it): on CUDA the reference multiplies the
    activations as the FP8 matmul rounds them (W8A8, ``round_input``: the op's emulation exactly), on the CPU
    as they are (W8A16)."""
    lin = nn.Linear(384, 256, bias=False).requires_grad_(False)
    m = fp8.Fp8Linear.from_linear(lin)
    assert not m.fast
    x = torch.randn(3, 5, 384, generator=torch.Generator().manual_seed(4))
    w8a16 = x @ m.dequantised().t()
    torch.testing.assert_close(m(x), w8a16, rtol=1e-6, atol=1e-6)
    xq, xs = fp8.quantise_input(x.reshape(-1, 384))
    w8a8 = fp8.fp8_block_mm(xq, xs, m.weight, m.weight_scale_inv, torch.float32).view(3, 5, 256)
    torch.testing.assert_close(fp8.round_input(x) @ m.dequantised().t(), w8a8, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the CUDA branch, on the CPU
    torch.testing.assert_close(m(x), w8a8, rtol=1e-5, atol=1e-5)
    spans = ((0, 128), (128, 128))
    for (s, n), y in zip(spans, m.forward_rows(x, spans), strict=True):
        torch.testing.assert_close(y, w8a8[..., s : s + n], rtol=1e-5, atol=1e-5)
    assert 0 < rel(w8a8, w8a16) < 0.06


def test_quantise_model_takes_the_decoder_projections_that_fit():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    layer = model.layers[0]
    layer.up = nn.Linear(512, 256, bias=False)  # K / 128 = 4: fits the FP8 matmul
    layer.small = nn.Linear(64, 32)  # does not fit: stays bf16
    layer.linear_attn = nn.Module()
    layer.linear_attn.in_proj_a = nn.Linear(512, 256)  # kept unquantised, as Qwen's releases do
    model.lm_head = nn.Linear(512, 256)
    want = ref_quantise(layer.up.weight.detach())
    assert fp8.quantise_model(model) == 1
    assert isinstance(layer.up, fp8.Fp8Linear) and layer.up.fast
    assert torch.equal(layer.up.weight_scale_inv, want[1])
    for m in (layer.small, layer.linear_attn.in_proj_a, model.lm_head):
        assert type(m) is nn.Linear


def test_target_dtype_resolution_and_refusals():
    assert fp8.wants_fp8(None, True, "cpu") is True  # an FP8 checkpoint on the CPU: run dequantised
    assert fp8.wants_fp8(None, False, "cpu") is False
    assert fp8.wants_fp8("bf16", True, "cpu") is False
    with pytest.raises(ValueError, match="the CPU has no FP8 matmul"):
        fp8.wants_fp8("fp8", False, "cpu")
    with pytest.raises(ValueError, match="'bf16' or 'fp8'"):
        fp8.wants_fp8("fp16", False, "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available.*--target-dtype bf16"):
            fp8.wants_fp8(None, True, "cuda:0")
