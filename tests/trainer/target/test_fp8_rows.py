"""Rowwise FP8 scales (trainer/target/fp8_rows.py, ``Fp8Linear(scales="row")``, ``--fp8-scales``) against the
tests' own row-by-row reference: quantisation of weights and activations, the ``dflash::fp8_row_mm`` op's CPU
kernel, the module's forward and row slices (no 128 alignment), block -> row conversion, the loader, and the
flag refused for a bf16 target."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.trainer_run import tiny_flags
from tests.trainer.target.fp8_ref import ref_dequantise, ref_quantise, rel, write_fp8
from trainer.run.flags import FlagError, build_parser, check_target, target_info
from trainer.run.settings import resolve
from trainer.target import fp8, fp8_rows
from trainer.target.capture import load_target

SHAPES = [(300, 200), (1, 5), (48, 384), (64, 1152)]


def ref_quantise_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row by row: scale = amax / 448 (1 for an all-zero row), q = w / scale in e4m3."""
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(w.shape[0], 1)
    for i, row in enumerate(w.float()):
        amax = row.abs().max()
        s[i, 0] = amax / 448.0 if amax > 0 else 1.0
        q[i] = (row / s[i, 0]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def _weights(shape, seed=0) -> torch.Tensor:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[0, 0] = 3.0  # an outlier: its row's scale is large
    if shape[0] > 2:
        w[2] = 0.0  # an all-zero row
    return w


@pytest.mark.parametrize("shape", SHAPES)
def test_quantise_rows_matches_the_row_by_row_reference(shape):
    w = _weights(shape)
    q, s = fp8_rows.quantise_rows(w)
    rq, rs = ref_quantise_rows(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (shape[0], 1)
    assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    if shape[0] > 2:
        assert s[2, 0] == 1.0 and not q[2].float().any()  # the all-zero row: scale 1, exact zeros
    back = fp8_rows.dequantise_rows(q, s)
    assert torch.equal(back, rq.float() * rs)
    assert rel(back, w) < 0.05


def test_quantise_input_rows_per_token():
    x = torch.randn(7, 384, generator=torch.Generator().manual_seed(1))
    x[3] *= 100.0  # one loud token: its own scale, the others untouched
    xq, xs = fp8_rows.quantise_input_rows(x)
    assert xs.shape == (7, 1) and xs.dtype == torch.float32
    torch.testing.assert_close(xs, x.abs().amax(-1, keepdim=True) / 448.0, rtol=0, atol=0)
    want = (x / xs).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(xq.view(torch.uint8), want.view(torch.uint8))


def test_the_ops_cpu_kernel_is_f_linear_on_the_dequantised_operands():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(96, 384, generator=g) * 0.05, torch.randn(11, 384, generator=g)
    q, s = fp8_rows.quantise_rows(w)
    xq, xs = fp8_rows.quantise_input_rows(x)
    want = F.linear(xq.float() * xs, q.float() * s)
    got = torch.ops.dflash.fp8_row_mm(xq, xs, q, s, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.ops.dflash.fp8_row_mm(xq, xs, q, s, torch.bfloat16).dtype == torch.bfloat16
    assert 0 < rel(got, x @ w.t()) < 0.06


def test_fits_row_mm_takes_the_h384_shapes_block_scaling_refuses():
    for n, k in ((1152, 384), (384, 1152), (384, 384)):
        assert fp8_rows.fits_row_mm(n, k) and not fp8.fits_scaled_mm(n, k)
    assert not fp8_rows.fits_row_mm(100, 384) and not fp8_rows.fits_row_mm(96, 200)


def test_row_module_from_linear_holds_rows_under_its_own_names():
    lin = nn.Linear(384, 448, bias=True).requires_grad_(False)
    m = fp8.Fp8Linear.from_linear(lin, "row")
    assert m.scales == "row" and m.fast  # K = 384: rowwise takes it, block scaling would not
    assert set(m.state_dict()) == {"weight", "weight_scale", "bias"}
    rq, rs = ref_quantise_rows(lin.weight)
    assert torch.equal(m.weight_scale, rs) and torch.equal(m.weight.view(torch.uint8), rq.view(torch.uint8))
    x = torch.randn(3, 5, 384)
    torch.testing.assert_close(m(x), F.linear(x, rq.float() * rs, lin.bias), rtol=1e-5, atol=1e-5)
    block = fp8.Fp8Linear.from_linear(lin).state_dict()
    with pytest.raises(RuntimeError, match="weight_scale"):  # a block layer's tensors never load as rows
        m.load_state_dict(block)
    with pytest.raises(ValueError, match="'block' or 'row'"):
        fp8.Fp8Linear.from_linear(lin, "col")


@pytest.mark.parametrize(
    "fp8_branch", [False, True]
)  # the CPU reference, or the CUDA branch on the op's CPU kernel
def test_forward_rows_in_row_mode_equals_slices_of_forward(monkeypatch, fp8_branch):
    lin = nn.Linear(384, 448, bias=True).requires_grad_(False)
    m = fp8.Fp8Linear.from_linear(lin, "row")
    if fp8_branch:
        monkeypatch.setattr(fp8.Fp8Linear, "_on_fp8", lambda self, x: self.fast)
    x = torch.randn(2, 9, 384, generator=torch.Generator().manual_seed(3))
    full = m(x)
    if fp8_branch:
        xq, xs = fp8_rows.quantise_input_rows(x.reshape(-1, 384))
        want = (xq.float() * xs) @ m.dequantised().t() + lin.bias
        torch.testing.assert_close(full, want.view(2, 9, 448), rtol=1e-5, atol=1e-5)
    # not 128-aligned but 16-row multiples (a matmul each), then spans that are not even that (sliced)
    for spans in (((0, 48), (48, 208), (256, 192)), ((0, 100), (100, 348))):
        for (s, n), y in zip(spans, m.forward_rows(x, spans), strict=True):
            torch.testing.assert_close(y, full[..., s : s + n], rtol=1e-5, atol=1e-5)
    if fp8_branch:  # traced as a compiled region traces it (the op through its fake kernel)
        spans = ((0, 48), (48, 400))
        traced = torch.compile(
            lambda h: [m(h), *m.forward_rows(h, spans)], backend="aot_eager", fullgraph=True
        )
        for got, ref in zip(traced(x), [full, *m.forward_rows(x, spans)], strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_block_to_row_conversion_costs_little():
    w = torch.randn(384, 512, generator=torch.Generator().manual_seed(4)) * 0.05
    lin = nn.Linear(512, 384, bias=False).requires_grad_(False)
    lin.weight.copy_(w)
    block = fp8.Fp8Linear.from_linear(lin)
    row = block.to_rows()
    assert row.scales == "row" and row.weight.dtype == torch.float8_e4m3fn and row.fast
    bd = ref_dequantise(*ref_quantise(w))
    rq, rs = ref_quantise_rows(bd)  # the block layer's real weight, requantised per row
    assert torch.equal(row.weight_scale, rs) and torch.equal(
        row.weight.view(torch.uint8), rq.view(torch.uint8)
    )
    conv = row.dequantised()
    assert rel(conv, bd) < 0.03  # the second rounding
    assert rel(conv, w) < 1.5 * rel(fp8.Fp8Linear.from_linear(lin, "row").dequantised(), w) + 0.01
    assert row.to_rows() is row


def _toy_model() -> nn.Module:
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    layer = model.layers[0]
    layer.up = nn.Linear(512, 256, bias=False)  # both scalings take it
    layer.h384 = nn.Linear(384, 1152, bias=False)  # K / 128 = 3: rows only
    layer.small = nn.Linear(64, 40)  # N % 16 != 0: neither
    layer.linear_attn = nn.Module()
    layer.linear_attn.in_proj_a = nn.Linear(512, 256)  # kept unquantised, as Qwen's releases do
    model.lm_head = nn.Linear(512, 256)
    return model.requires_grad_(False)


def test_quantise_model_per_row_and_a_block_model_converted_to_rows():
    rows, blocks = _toy_model(), _toy_model()
    blocks.load_state_dict(rows.state_dict())
    assert fp8.quantise_model(rows, scales="row") == 2
    layer = rows.layers[0]
    assert layer.up.scales == layer.h384.scales == "row" and layer.h384.fast
    assert torch.equal(layer.up.weight_scale, ref_quantise_rows(blocks.layers[0].up.weight)[1])
    for m in (layer.small, layer.linear_attn.in_proj_a, rows.lm_head):
        assert type(m) is nn.Linear
    assert fp8.quantise_model(blocks) == 1 and fp8.to_row_scales(blocks) == 1
    up = blocks.layers[0].up
    assert up.scales == "row" and not hasattr(up, "weight_scale_inv")
    assert type(blocks.layers[0].h384) is nn.Linear  # block scaling did not take it: nothing to convert
    assert fp8.to_row_scales(blocks) == 0


def test_fp8_scales_resolution():
    assert fp8.scales_for(None, True) == "block" and fp8.scales_for("row", True) == "row"
    assert fp8.scales_for(None, False) == "block"  # not asked: nothing to refuse
    with pytest.raises(ValueError, match="--fp8-scales row: the target runs in bf16"):
        fp8.scales_for("row", False)


def test_the_flag_is_refused_for_a_bf16_target(tiny_assets, tmp_path):
    for extra in (("--fp8-scales", "row"), ("--fp8-scales", "block", "--target-dtype", "bf16")):
        with pytest.raises(FlagError, match="applies to FP8 targets only") as e:
            resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "a", *extra)))
        assert e.value.flag == "--fp8-scales"
    s = resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "b")))
    assert s.fp8_scales is None
    fp8_dir = tmp_path / "fp8"
    write_fp8(str(tiny_assets / "target"), str(fp8_dir))
    args = build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "c", "--fp8-scales", "row"))
    check_target(args, target_info(str(fp8_dir)), cuda=False)  # an FP8 checkpoint: fp8 by default, taken
    args = build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "d", "--fp8-scales", "row", "--target-dtype", "bf16"))  # fmt: skip
    with pytest.raises(FlagError, match=r"--target-dtype bf16"):
        check_target(args, target_info(str(fp8_dir)), cuda=False)


def test_an_fp8_checkpoint_loads_rowwise(tiny_assets, tmp_path):
    path = tmp_path / "fp8"
    write_fp8(str(tiny_assets / "target"), str(path))
    block = load_target(str(path), "cpu", torch.float32, [0, 1], need_final_hidden=True)
    rows = load_target(str(path), "cpu", torch.float32, [0, 1], need_final_hidden=True, fp8_scales="row")
    b = {n: m for n, m in block.named_modules() if isinstance(m, fp8.Fp8Linear)}
    r = {n: m for n, m in rows.named_modules() if isinstance(m, fp8.Fp8Linear)}
    assert b and set(b) == set(r) and all(m.scales == "row" for m in r.values())
    for n, m in r.items():
        assert rel(m.dequantised(), b[n].dequantised()) < 0.03, n
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(rows(input_ids=ids).logits, block(input_ids=ids).logits) < 0.05
    with pytest.raises(ValueError, match="--fp8-scales row: the target runs in bf16"):
        load_target(str(path), "cpu", torch.float32, [0], target_dtype="bf16", fp8_scales="row")
