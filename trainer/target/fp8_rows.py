"""FP8 target projections with rowwise scales: one float32 scale per weight row (output channel) and one per
token of the activations, beside ``fp8.py``'s block-128 layout (issue 36).

- ``quantise_rows(w) -> (e4m3 (N, K), float32 (N, 1))``: scale = row amax / 448 (1 for an all-zero row);
- ``quantise_input_rows(x2) -> (e4m3 (M, K), float32 (M, 1))``: per token, scale = amax / 448 (plain tensor
  ops: a compiled region fuses them into the norm before the projection);
- the custom op ``dflash::fp8_row_mm``: on CUDA ``torch._scaled_mm`` with the activation scales (M, 1) and the
  weight's (1, N) (rowwise scaling, fast accumulation; on one H200 at the Qwen3.6-27B projection shapes
  1,190-1,364 TFLOP/s against the block-scaled call's ~989); its CPU kernel emulates it dequantised in fp32
  (tests); a fake kernel for compiled regions;
- ``fits_row_mm(out, in)``: K and N multiples of 16 (the h384 targets' K = 384 and 1,152 fit, which the
  block-scaled matmul refuses).

``fp8.Fp8Linear(scales="row")`` holds such a weight (``weight``, ``weight_scale`` (N, 1)) and calls
``row_linear_many`` here.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ALIGN = 16  # _scaled_mm: K and N multiples of 16


def fits_row_mm(out_features: int, in_features: int) -> bool:
    """Shapes the rowwise-scaled FP8 matmul takes: K and N multiples of 16."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


def quantise_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) weight -> (e4m3 (N, K), float32 scale (N, 1)): per row, scale = amax / 448 (1 for an all-zero
    row)."""
    wf = w.float()
    amax = wf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (wf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def dequantise_rows(weight: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (weight.float() * scale.float()).to(dtype)


def quantise_input_rows(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) activations -> (e4m3 (M, K), float32 scales (M, 1)): per token, scale = amax / 448."""
    xf = x2.float()
    s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), s


@torch.library.custom_op("dflash::fp8_row_mm", mutates_args=())
def fp8_row_mm(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``(xq * xs) @ (w * ws).T``: xq (M, K) e4m3 with xs (M, 1); w (N, K) e4m3 with ws (N, 1). The default
    (CPU) kernel: the same computation dequantised, in fp32."""
    return ((xq.float() * xs.float()) @ dequantise_rows(w, ws).t()).to(out_dtype)


@fp8_row_mm.register_kernel("cuda")
def _fp8_row_mm_cuda(xq, xs, w, ws, out_dtype):
    xq = xq.contiguous()  # row-major, whatever layout a compiled region chose
    sb = ws.reshape(1, -1)  # (1, N); a row slice's scales start anywhere: give them an aligned copy
    if sb.data_ptr() % 16 or not sb.is_contiguous():
        sb = sb.clone(memory_format=torch.contiguous_format)
    # rowwise scaling writes bf16 only
    out = torch._scaled_mm(
        xq,
        w.t(),
        scale_a=xs.float().contiguous(),
        scale_b=sb,
        out_dtype=torch.bfloat16,
        use_fast_accum=True,
    )
    return out if out_dtype == torch.bfloat16 else out.to(out_dtype)


@fp8_row_mm.register_fake
def _fp8_row_mm_fake(xq, xs, w, ws, out_dtype):
    return xq.new_empty((xq.shape[0], w.shape[0]), dtype=out_dtype)


def quantised_linear_many(x: torch.Tensor, rows, bias, quantise, matmul) -> list[torch.Tensor]:
    """x (..., K) quantised once (``quantise``: (M, K) -> (e4m3, scales)), then one FP8 ``matmul`` per
    ``(w, ws)`` of ``rows`` (+ its bias, or None): the shared shape of the row and the block layouts."""
    lead = x.shape[:-1]
    xq, xs = quantise(x.reshape(-1, x.shape[-1]))
    outs = []
    for (w, ws), b in zip(rows, bias, strict=True):
        y = matmul(xq, xs, w, ws, x.dtype)
        outs.append((y if b is None else y + b).view(*lead, w.shape[0]))
    return outs


def row_linear_many(x: torch.Tensor, rows, bias) -> list[torch.Tensor]:
    """x (..., K) quantised once per token, then one rowwise FP8 matmul per ``(w, ws)`` of ``rows``."""
    return quantised_linear_many(x, rows, bias, quantise_input_rows, fp8_row_mm)


def row_linear(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, bias=None) -> torch.Tensor:
    return row_linear_many(x, [(w, ws)], [bias])[0]
