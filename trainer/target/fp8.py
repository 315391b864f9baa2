"""FP8 target projections: block-wise e4m3 weights as Qwen's FP8 checkpoints hold them, and their matmul.

The layout (``fp8_config`` reads the checkpoint's ``quantization_config``): a linear layer's ``weight`` is
float8_e4m3fn (out, in) and ``weight_scale_inv`` float32 (ceil(out / 128), ceil(in / 128)), one scale per
128 x 128 block; the real weight is ``weight.float() * scale_inv`` of its block (``dequantise``).
``quantise(w)`` makes that pair from a bf16 / fp32 weight (scale = block amax / 448, as transformers'
``Fp8Quantize`` and the published checkpoints do): quantise-on-load for ``--target-dtype fp8`` with a bf16
checkpoint.

``Fp8Linear`` holds the pair as the checkpoint has it (no bf16 copy), parameters named as there, so the
loader fills them from the files directly. Its forward:

- on CUDA, where the shapes fit (``fits_scaled_mm``): ``block_linear``, the activations quantised per token
  and 128-column group (``quantise_input``: 1 x 128 scales) and ``torch._scaled_mm`` with the weight's
  128 x 128 scales as they are (cuBLAS block scaling, sm_90, CUDA 12.9+), inside the custom op
  ``dflash::fp8_block_mm`` (compiled regions keep it whole and fuse the activation quantisation into the
  norm before it; the op's CPU kernel emulates it, for tests);
- elsewhere (the CPU, shapes that do not fit): the reference, ``F.linear`` on the dequantised weight; on
  CUDA a block layer's activations are first rounded as the FP8 matmul would round them (``round_input``:
  W8A8, what a server's block-scaled kernel computes at a shape cuBLAS refuses, e.g. the h384 targets'
  K = 384), on the CPU they are not (W8A16, for tests).

``forward_rows(x, spans)`` projects row slices of the weight (the hybrid path's q / k / v of ``in_proj_qkv``)
with one activation quantisation. ``wants_fp8(target_dtype, checkpoint_fp8, device)`` resolves
``--target-dtype`` and refuses a device that cannot run it, with the reason; ``swap`` / ``quantise_model``
put ``Fp8Linear`` modules into a model.

Rowwise scales (``--fp8-scales row``, ``fp8_rows.py``): ``Fp8Linear(scales="row")`` holds ``weight`` (e4m3)
and ``weight_scale`` (float32 (out, 1), one scale per output row; named apart from the checkpoint's
``weight_scale_inv`` so that a block checkpoint is never read as rows) and runs ``dflash::fp8_row_mm`` (the
activations quantised per token) where ``fp8_rows.fits_row_mm`` takes the shape. ``from_linear(linear,
"row")`` quantises a bf16 weight per row; ``to_rows()`` turns a block-scaled layer into a rowwise one (that
layer dequantised to fp32 for the moment, requantised per row), and ``to_row_scales(model)`` does it for a
loaded model, layer by layer (never the whole model in bf16): an FP8 checkpoint in Qwen's block layout can
run rowwise too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.run.fp8_config import BLOCK, scales_refusal
from trainer.target.fp8_rows import (
    E4M3,
    E4M3_MAX,
    dequantise_rows,
    fits_row_mm,
    quantise_rows,
    quantised_linear_many,
    row_linear_many,
)

SCALES = ("block", "row")  # --fp8-scales
FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
SCALE = "weight_scale_inv"
ROW_SCALE = "weight_scale"  # the rowwise layout's (out, 1) scales: never a checkpoint's block scales
# linear layers a bf16 checkpoint keeps unquantised on load: Qwen's own FP8 releases keep the Gated
# DeltaNet's tiny a / b projections and the MoE routers in bf16
KEEP = ("linear_attn.in_proj_a", "linear_attn.in_proj_b", "mlp.gate", "shared_expert_gate")


# -- the block layout -------------------------------------------------------------------------------------
def scale_shape(out_features: int, in_features: int) -> tuple[int, int]:
    return (-(-out_features // BLOCK), -(-in_features // BLOCK))


def scale_key(weight_key: str) -> str:
    """``x.weight`` -> ``x.weight_scale_inv``."""
    return weight_key.removesuffix("weight") + SCALE


def check_scale(key: str, dtype, shape, weight_shape) -> None:
    """A weight's scale tensor as the layout wants it, or ValueError naming it."""
    want = scale_shape(*weight_shape)
    if dtype != torch.float32:
        raise ValueError(f"{key}: dtype {dtype}, expected torch.float32 (one scale per 128 x 128 block)")
    if tuple(shape) != want:
        raise ValueError(
            f"{key}: shape {tuple(shape)}, expected {want} for its {tuple(weight_shape)} weight "
            "(one scale per 128 x 128 block)"
        )


def expand_scale(scale_inv: torch.Tensor, shape) -> torch.Tensor:
    """The per-block scales repeated over their blocks' elements, cut to ``shape`` (out, in)."""
    out, inn = shape
    return scale_inv.repeat_interleave(BLOCK, 0)[:out].repeat_interleave(BLOCK, 1)[:, :inn]


def dequantise(weight: torch.Tensor, scale_inv: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (weight.float() * expand_scale(scale_inv.float(), weight.shape)).to(dtype)


def quantise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight -> (e4m3 weight, float32 scale_inv): per 128 x 128 block, scale = amax / 448 (1 for an
    all-zero block); the last blocks of a shape not a multiple of 128 are partial."""
    out, inn = w.shape
    R, C = scale_shape(out, inn)
    blocks = F.pad(w.float(), (0, C * BLOCK - inn, 0, R * BLOCK - out)).view(R, BLOCK, C, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale_inv = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale_inv[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(R * BLOCK, C * BLOCK)[:out, :inn].contiguous(), scale_inv


def fits_scaled_mm(out_features: int, in_features: int) -> bool:
    """Shapes cuBLAS's block-scaled FP8 matmul takes: K a multiple of 128 with K / 128 a multiple of 4 (the
    scales' 16-byte aligned rows), N a multiple of 16."""
    return in_features % BLOCK == 0 and (in_features // BLOCK) % 4 == 0 and out_features % 16 == 0


# -- the module ----------------------------------------------------------------------------------------------
def check_scales(scales: str) -> str:
    if scales not in SCALES:
        raise ValueError(f"FP8 scales must be 'block' or 'row', got {scales!r}")
    return scales


def fits(scales: str, out_features: int, in_features: int) -> bool:
    """Whether the FP8 matmul of this scaling takes the shape."""
    return (fits_scaled_mm if scales == "block" else fits_row_mm)(out_features, in_features)


class Fp8Linear(nn.Module):
    """A frozen linear layer of e4m3 weights with 128 x 128 block scales, or one scale per row (module
    docstring)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, device=None, dtype=None, scales="block"
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scales = check_scales(scales)
        w = torch.empty(out_features, in_features, dtype=E4M3, device=device)
        self.weight = nn.Parameter(w, requires_grad=False)
        shape = scale_shape(out_features, in_features) if scales == "block" else (out_features, 1)
        s = nn.Parameter(torch.empty(*shape, dtype=torch.float32, device=device), requires_grad=False)
        setattr(self, SCALE if scales == "block" else ROW_SCALE, s)
        b = torch.empty(out_features, dtype=dtype, device=device) if bias else None
        self.bias = None if b is None else nn.Parameter(b, requires_grad=False)
        self.fast = fits(scales, out_features, in_features)

    @property
    def scale(self) -> torch.Tensor:
        """The weight's scales: ``weight_scale_inv`` (block) or ``weight_scale`` (row)."""
        return getattr(self, SCALE if self.scales == "block" else ROW_SCALE)

    @classmethod
    def like(cls, linear: nn.Linear, scales: str = "block") -> Fp8Linear:
        """An empty one of ``linear``'s shape, device and bias dtype (for the loader to fill)."""
        w, b = linear.weight, linear.bias
        return cls(linear.in_features, linear.out_features, b is not None, w.device, w.dtype, scales)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scales: str = "block") -> Fp8Linear:
        """``linear``'s weight quantised (quantise-on-load), per block or per row."""
        return cls.like(linear, scales)._set(linear.weight.detach(), linear.bias)

    def to_rows(self) -> Fp8Linear:
        """This layer with one scale per row: a block-scaled weight dequantised to fp32 (this layer only, for
        the moment) and requantised per row; a rowwise one as it is."""
        if self.scales == "row":
            return self
        b = self.bias
        dtype = None if b is None else b.dtype
        m = Fp8Linear(self.in_features, self.out_features, b is not None, self.weight.device, dtype, "row")
        return m._set(self.dequantised(), b)

    def _set(self, w: torch.Tensor, bias) -> Fp8Linear:
        with torch.no_grad():
            q, s = (quantise if self.scales == "block" else quantise_rows)(w)
            self.weight.copy_(q)
            self.scale.copy_(s)
            if bias is not None:
                self.bias.copy_(bias)
        return self

    def dequantised(self, dtype=torch.float32) -> torch.Tensor:
        if self.scales == "row":
            return dequantise_rows(self.weight, self.weight_scale, dtype)
        return dequantise(self.weight, self.weight_scale_inv, dtype)

    def _on_fp8(self, x: torch.Tensor) -> bool:
        """Whether ``x`` goes through the FP8 matmul (else the dequantised reference)."""
        return x.is_cuda and self.fast

    def _matmul_many(self, x: torch.Tensor, rows, bias) -> list[torch.Tensor]:
        return (block_linear_many if self.scales == "block" else row_linear_many)(x, rows, bias)

    def _reference_input(self, x: torch.Tensor) -> torch.Tensor:
        """The activations the dequantised reference multiplies (module docstring): rounded to e4m3 with
        1 x 128 scales on CUDA (block layout, K a multiple of 128), as they are elsewhere."""
        if x.is_cuda and self.scales == "block" and self.in_features % BLOCK == 0:
            return round_input(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._on_fp8(x):
            return self._matmul_many(x, [(self.weight, self.scale)], [self.bias])[0]
        return F.linear(self._reference_input(x), self.dequantised(x.dtype), self.bias)

    def _rows_fit(self, start: int, n: int) -> bool:
        """Whether rows ``[start, start + n)`` make a matmul of their own: block-aligned (block), a multiple
        of 16 rows (row)."""
        if self.scales == "row":
            return fits_row_mm(n, self.in_features)
        return start % BLOCK == 0 and (n % BLOCK == 0 or start + n == self.out_features)

    def _row_slice(self, s: int, n: int):
        if self.scales == "row":
            return self.weight[s : s + n], self.weight_scale[s : s + n]
        return self.weight[s : s + n], self.weight_scale_inv[s // BLOCK : -(-(s + n) // BLOCK)]

    def forward_rows(self, x: torch.Tensor, spans) -> list[torch.Tensor]:
        """The projections by the weight's rows ``[s, s + n)`` for each ``(s, n)`` in ``spans``."""
        if not all(self._rows_fit(s, n) for s, n in spans):
            y = self(x)
            return [y[..., s : s + n] for s, n in spans]
        b = self.bias
        bias = [None if b is None else b[s : s + n] for s, n in spans]
        if self._on_fp8(x):
            return self._matmul_many(x, [self._row_slice(s, n) for s, n in spans], bias)
        wd, xr = self.dequantised(x.dtype), self._reference_input(x)
        return [F.linear(xr, wd[s : s + n], bb) for (s, n), bb in zip(spans, bias, strict=True)]

    def extra_repr(self) -> str:
        how = f"e4m3 blocks {BLOCK}x{BLOCK}" if self.scales == "block" else "e4m3 rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, {how}"


# -- the FP8 matmul (CUDA; its CPU kernel emulates it) ---------------------------------------------------
def quantise_input(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) activations (K a multiple of 128) -> (e4m3 (M, K), float32 scales (M, K / 128)): per token and
    128-column group, scale = amax / 448. Plain tensor ops: a compiled region fuses them into the norm."""
    M, K = x2.shape
    g = x2.float().reshape(M, K // BLOCK, BLOCK)
    s = g.abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
    q = (g / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(M, K), s


def round_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` (..., K) as ``quantise_input`` rounds it (e4m3, per token and 128-column group), dequantised to
    ``x``'s dtype: the activations a block-scaled FP8 matmul multiplies."""
    K = x.shape[-1]
    q, s = quantise_input(x.reshape(-1, K))
    return (q.float().view(-1, K // BLOCK, BLOCK) * s.unsqueeze(-1)).view(x.shape).to(x.dtype)


@torch.library.custom_op("dflash::fp8_block_mm", mutates_args=())
def fp8_block_mm(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``(xq * xs) @ (w * ws).T``: xq (M, K) e4m3 with xs (M, K / 128); w (N, K) e4m3 with ws 128 x 128 block
    scales. The default (CPU) kernel: the same computation dequantised, in fp32."""
    M, K = xq.shape
    xd = (xq.float().view(M, K // BLOCK, BLOCK) * xs.float().unsqueeze(-1)).view(M, K)
    return (xd @ dequantise(w, ws).t()).to(out_dtype)


@fp8_block_mm.register_kernel("cuda")
def _fp8_block_mm_cuda(xq, xs, w, ws, out_dtype):
    M = xq.shape[0]
    xq = xq.contiguous()  # row-major, whatever layout a compiled region chose
    pad = -M % 4  # the 1 x 128 scales' leading dimension, 16-byte aligned
    if pad:
        xq = F.pad(xq.view(torch.uint8), (0, 0, 0, pad)).view(E4M3)
        xs = F.pad(xs, (0, 0, 0, pad), value=1.0)
    # cuBLAS block scaling: a row-major with its 1 x 128 scales outer-dim-major (stride (1, M)); b = w.t()
    # column-major with the checkpoint's (N / 128, K / 128) scales transposed as they are
    out = torch._scaled_mm(
        xq, w.t(), scale_a=xs.t().contiguous().t(), scale_b=ws.t(), out_dtype=out_dtype, use_fast_accum=False
    )
    return out[:M].clone() if pad else out


@fp8_block_mm.register_fake
def _fp8_block_mm_fake(xq, xs, w, ws, out_dtype):
    return xq.new_empty((xq.shape[0], w.shape[0]), dtype=out_dtype)


def block_linear_many(x: torch.Tensor, rows, bias) -> list[torch.Tensor]:
    """x (..., K) quantised once, then one FP8 matmul per ``(w, ws)`` of ``rows`` (+ its bias, or None)."""
    return quantised_linear_many(x, rows, bias, quantise_input, fp8_block_mm)


def block_linear(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, bias=None) -> torch.Tensor:
    return block_linear_many(x, [(w, ws)], [bias])[0]


# -- the device and the model --------------------------------------------------------------------------------
def fp8_unsupported(device) -> str | None:
    """Why ``device`` cannot run the block-scaled FP8 matmul, or None when it can."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"the {dev.type} has no FP8 matmul"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cc = torch.cuda.get_device_capability(dev)
    if cc[0] != 9:
        name = torch.cuda.get_device_name(dev)
        return (
            f"{dev} ({name}) is sm_{cc[0]}{cc[1]}: cuBLAS's block-scaled FP8 matmul (1 x 128 activation and "
            "128 x 128 weight scales) runs on Hopper (sm_90) GPUs"
        )
    ver = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    if ver < (12, 9):
        return f"this torch is built with CUDA {torch.version.cuda}: block-scaled FP8 matmuls need CUDA 12.9+"
    return None


def wants_fp8(target_dtype: str | None, checkpoint_fp8: bool, device) -> bool:
    """``--target-dtype`` resolved (None: fp8 for an FP8 checkpoint, else bf16); a device that cannot run the
    choice is refused with the reason. The CPU runs an FP8 checkpoint dequantised (tests), nothing else."""
    choice = target_dtype or ("fp8" if checkpoint_fp8 else "bf16")
    if choice not in ("bf16", "fp8"):
        raise ValueError(f"target dtype must be 'bf16' or 'fp8', got {choice!r}")
    if choice == "bf16":
        return False
    if torch.device(device).type == "cpu":
        if checkpoint_fp8:
            return True
        raise ValueError(
            "target dtype fp8 on the CPU: the CPU has no FP8 matmul (it runs an FP8 checkpoint dequantised, "
            "for tests, but does not quantise a bf16 one)"
        )
    why = fp8_unsupported(device)
    if why is not None:
        hint = "; --target-dtype bf16 runs this FP8 checkpoint dequantised to bf16" if checkpoint_fp8 else ""
        raise RuntimeError(f"target dtype fp8: {why}{hint}")
    return True


def scales_for(fp8_scales: str | None, use_fp8: bool) -> str:
    """``--fp8-scales`` resolved (None: "block", the checkpoints' and servers' layout); given for a target that
    runs bf16 it is refused (``fp8_config.scales_refusal``: it would change nothing)."""
    refusal = scales_refusal(fp8_scales, use_fp8)
    if refusal is not None:
        raise ValueError(f"--fp8-scales {refusal}")
    return check_scales(fp8_scales or "block")


def swap(model: nn.Module, names) -> None:
    """Replace each named ``nn.Linear`` by an empty ``Fp8Linear`` of its shape (the loader fills it)."""
    for name in names:
        model.set_submodule(name, Fp8Linear.like(model.get_submodule(name)))


def quantisable(model: nn.Module, scales: str | None) -> list[str]:
    """The decoder's ``nn.Linear`` layers quantise-on-load takes, except ``KEEP``: those whose shape the FP8
    matmul of ``scales`` takes (None: every one, whatever its shape)."""
    return [
        n
        for n, m in model.named_modules()
        if type(m) is nn.Linear
        and ".layers." in f".{n}"
        and not n.endswith(KEEP)
        and (scales is None or fits(scales, m.out_features, m.in_features))
    ]


def quantise_model(model: nn.Module, scales: str = "block") -> int:
    """Quantise-on-load: every ``quantisable`` layer for ``scales`` ("block": 128 x 128 block scales; "row": one
    per output row) becomes an ``Fp8Linear`` (its bf16 weight freed as it goes). Returns how many."""
    names = quantisable(model, check_scales(scales))
    for n in names:
        model.set_submodule(n, Fp8Linear.from_linear(model.get_submodule(n), scales))
    return len(names)


def to_row_scales(model: nn.Module) -> int:
    """Every block-scaled ``Fp8Linear`` of a loaded model made rowwise (``Fp8Linear.to_rows``), one layer at a
    time: each layer's block weight is freed as its rowwise copy is made. Returns how many."""
    names = [n for n, m in model.named_modules() if isinstance(m, Fp8Linear) and m.scales == "block"]
    with torch.no_grad():
        for n in names:
            model.set_submodule(n, model.get_submodule(n).to_rows())
    return len(names)
