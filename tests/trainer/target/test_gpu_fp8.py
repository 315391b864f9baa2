"""FP8 target projections on a Hopper GPU (trainer/target/fp8.py): the block-scaled ``torch._scaled_mm``
(1 x 128 activation scales, the checkpoint's 128 x 128 weight scales) against its fp32 emulation and against
bf16, eager and compiled; FP8 capture of small targets whose shapes take the FP8 matmul (dense: the
compiled direct loop; hybrid: the flattened compiled regions, with fla) against their bf16 capture, from an
FP8 checkpoint and quantised on load, block and rowwise scales; the rowwise op (``dflash::fp8_row_mm``,
fp8_rows.py) against its CPU kernel, its module's row slices and compiled forward; and a timing print at the
Qwen3.6-27B's seven projection shapes (bf16, FP8 block-scaled eager / compiled / matmul alone, FP8 rowwise
op eager / compiled / matmul alone; not asserted).

Run on an H200: ``PYTHONPATH=. python -m pytest tests/trainer/target/test_gpu_fp8.py -q -s``
(``DFLASH_GPU_OUT=DIR`` also writes the figures to DIR/fp8_gpu.json). Skipped without CUDA."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
import torch.nn.functional as F

from tests.trainer.target.fp8_ref import rel, write_fp8
from trainer.target import fp8, fp8_rows
from trainer.target.capture import capture, capture_of, decoder_of, load_target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = "cuda"
RESULTS: dict = {}
# (N, K) of the Qwen3.6-27B's projections: in_proj_qkv, in_proj_z, out_proj / o_proj, q_proj (with its
# output gate), k_proj / v_proj, gate_proj / up_proj, down_proj
SHAPES_27B = [
    (10240, 5120),
    (6144, 5120),
    (5120, 6144),
    (12288, 5120),
    (1024, 5120),
    (17408, 5120),
    (5120, 17408),
]
TOKENS = 49152  # the packed call the issue measured
LENS = (300, 3, 1, 200, 520)  # one packed row of documents


def _record(name: str, value) -> None:
    RESULTS[name] = value
    out = os.environ.get("DFLASH_GPU_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "fp8_gpu.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)


def _emulated(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """What the FP8 matmul computes, in fp32: the quantised activations times the dequantised weight."""
    xq, xs = fp8.quantise_input(x.reshape(-1, x.shape[-1]))
    xd = (xq.float().view(xq.shape[0], -1, 128) * xs.unsqueeze(-1)).view(xq.shape)
    return (xd @ fp8.dequantise(q, s).t()).view(*x.shape[:-1], q.shape[0])


def test_this_gpu_runs_the_block_scaled_fp8_matmul():
    assert fp8.fp8_unsupported(DEV) is None, fp8.fp8_unsupported(DEV)
    assert fp8.wants_fp8(None, True, DEV) and fp8.wants_fp8("fp8", False, DEV)


@pytest.mark.parametrize(("M", "N", "K"), [(4096, 1024, 5120), (1003, 6144, 5120), (512, 5120, 17408)])
def test_block_scaled_matmul_matches_its_emulation_and_bf16(M, N, K):
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=DEV, generator=g) * 0.02
    q, s = fp8.quantise(w)
    got = fp8.block_linear(x, q, s)
    emu = _emulated(x, q, s)
    ref = F.linear(x, w.to(torch.bfloat16))
    errs = {"vs_emulation": rel(got, emu), "vs_bf16": rel(got, ref), "emulation_vs_bf16": rel(emu, ref)}
    print(f"\n(M, N, K) = {(M, N, K)}: {errs}")
    _record(f"matmul {M}x{N}x{K}", errs)
    assert got.dtype == torch.bfloat16 and got.shape == (M, N)
    assert errs["vs_emulation"] < 5e-3
    assert errs["vs_bf16"] < 0.06


def test_rows_and_compiled_forward_equal_the_eager_one():
    lin = torch.nn.Linear(5120, 2048 + 2048 + 6144, bias=False, device=DEV, dtype=torch.bfloat16)
    m = fp8.Fp8Linear.from_linear(lin)
    assert m.fast
    x = torch.randn(3, 700, 5120, device=DEV, dtype=torch.bfloat16)
    eager = m(x)
    spans = ((0, 2048), (2048, 2048), (4096, 6144))
    for (s, n), y in zip(spans, m.forward_rows(x, spans), strict=True):
        assert rel(y, eager[..., s : s + n]) < 1e-3
    norm = torch.nn.RMSNorm(5120, device=DEV, dtype=torch.bfloat16).requires_grad_(
        False
    )  # frozen, as the target
    compiled = torch.compile(lambda h: m(norm(h)))
    # the quantisation fused into the norm sees its fp32 output, not the bf16-rounded one: about 1 in 64
    # values lands in the next e4m3 step (~1.6 % rms); a wrong scale layout would be off by far more
    assert rel(compiled(x), m(norm(x))) < 0.05


@pytest.mark.parametrize(
    ("M", "N", "K"),
    [(4096, 1024, 5120), (1003, 6144, 5120), (512, 5120, 17408), (777, 1152, 384), (64, 384, 1152)],
)
def test_rowwise_op_matches_its_cpu_kernel_and_bf16(M, N, K):
    """The CUDA kernel (``torch._scaled_mm``, rowwise scales, fast accumulation) against the op's CPU kernel
    on the same e4m3 operands (fp32, dequantised), within FP8 accumulation tolerance; the h384 shapes too."""
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=DEV, generator=g) * 0.02
    q, s = fp8_rows.quantise_rows(w)
    xq, xs = fp8_rows.quantise_input_rows(x)
    got = fp8_rows.fp8_row_mm(xq, xs, q, s, torch.bfloat16)
    cpu = fp8_rows.fp8_row_mm(xq.cpu(), xs.cpu(), q.cpu(), s.cpu(), torch.float32)
    ref = F.linear(x, w.to(torch.bfloat16))
    errs = {"vs_cpu_kernel": rel(got.cpu(), cpu), "vs_bf16": rel(got, ref)}
    print(f"\nrowwise (M, N, K) = {(M, N, K)}: {errs}")
    _record(f"row matmul {M}x{N}x{K}", errs)
    assert got.dtype == torch.bfloat16 and got.shape == (M, N)
    assert errs["vs_cpu_kernel"] < 5e-3
    assert errs["vs_bf16"] < 0.06
    f32 = fp8_rows.fp8_row_mm(xq, xs, q, s, torch.float32)  # another out dtype: computed in bf16, cast
    assert f32.dtype == torch.float32 and rel(f32, got) < 1e-6


def test_rowwise_module_rows_unaligned_and_compiled_equal_the_eager_forward():
    lin = torch.nn.Linear(5120, 2048 + 2048 + 6144, bias=True, device=DEV, dtype=torch.bfloat16)
    block = fp8.Fp8Linear.from_linear(lin)
    m = block.to_rows()
    assert m.scales == "row" and m.fast
    x = torch.randn(3, 700, 5120, device=DEV, dtype=torch.bfloat16)
    eager = m(x)
    assert rel(eager, block(x)) < 0.1 and rel(eager, lin(x)) < 0.1  # two roundings each; a wrong layout: ~1
    for spans in (((0, 2048), (2048, 2048), (4096, 6144)), ((0, 48), (48, 4000), (4048, 6192)), ((1, 16),)):
        for (s, n), y in zip(spans, m.forward_rows(x, spans), strict=True):
            assert rel(y, eager[..., s : s + n]) < 1e-3, (s, n)
    norm = torch.nn.RMSNorm(5120, device=DEV, dtype=torch.bfloat16).requires_grad_(
        False
    )  # frozen, as the target
    compiled = torch.compile(lambda h: m(norm(h)))
    assert rel(compiled(x), m(norm(x))) < 0.05  # as the block test: the fused quantisation sees fp32


def _dense_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip


def _hybrid_config():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip


def _targets(tmp_path, config):
    """A bf16 checkpoint of random weights whose projections fit the FP8 matmul, and its FP8 copy."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "bf16")
    write_fp8(str(tmp_path / "bf16"), str(tmp_path / "fp8"))
    return str(tmp_path / "bf16"), str(tmp_path / "fp8")


def _row():
    ids = torch.randint(0, 512, (1, sum(LENS)), generator=torch.Generator().manual_seed(1))
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(LENS)]).view(1, -1)
    return ids.to(DEV), doc


def _capture_errors(name: str, model, ref, layers) -> dict:
    ids, doc = _row()
    got, _ = capture(model, ids, doc, layers)
    want, _ = capture(ref, ids, doc, layers)
    emb = decoder_of(ref).embed_tokens(ids).repeat(1, 1, len(layers))
    H = want.shape[-1] // len(layers)
    sl = [slice(i * H, (i + 1) * H) for i in range(len(layers))]
    out = {
        "per_layer": [rel(got[..., s], want[..., s]) for s in sl],
        "layers_part": [rel((got - emb)[..., s], (want - emb)[..., s]) for s in sl],
    }
    s0, out["alone_vs_packed"] = 0, []
    for n in LENS:  # documents alone = their slice of the packed row (up to e4m3 steps the GEMMs' last
        # bf16 bit can tip: the activations are quantised per token, never across documents)
        alone, _ = capture(model, ids[:, s0 : s0 + n], torch.zeros(1, n, dtype=torch.long), layers)
        out["alone_vs_packed"].append(rel(got[:, s0 : s0 + n], alone))
        s0 += n
    print(f"\n{name}: {out}")
    _record(name, out)  # before the assertion: a failing run keeps its figures (DFLASH_GPU_OUT)
    # 0.2: a document that sees its neighbours differs from itself alone by 1.11-1.16 at this config (CPU, the
    # doc ids zeroed); FP8 rounding alone gave 0.047-0.062 on an H200 (2026-12-04), the first document's
    # 0.062 included, which has nothing before it to leak: a bf16 bit tipping an e4m3 step by row count
    assert all(e < 0.2 for e in out["alone_vs_packed"]), (name, out["alone_vs_packed"])
    return out


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_fp8_capture_is_close_to_bf16(kind, tmp_path):
    if kind == "hybrid" and importlib.util.find_spec("fla") is None:
        pytest.skip("needs flash-linear-attention")
    plain, quant = _targets(tmp_path, _dense_config() if kind == "dense" else _hybrid_config())
    layers = [0, 1, 3]
    ref = load_target(plain, DEV, torch.bfloat16, layers)
    for scales in ("block", "row"):
        for source, path, dt in (("fp8 checkpoint", quant, None), ("quantised on load", plain, "fp8")):
            model = load_target(path, DEV, torch.bfloat16, layers, target_dtype=dt, fp8_scales=scales)
            lin = [m for m in model.modules() if isinstance(m, fp8.Fp8Linear) and m.fast]
            assert len(lin) >= 5 * len(decoder_of(model).layers) and {m.scales for m in lin} == {scales}
            assert capture_of(model).compiled == capture_of(ref).compiled
            errs = _capture_errors(f"{kind} capture, {source}, {scales} scales", model, ref, layers)
            assert all(e < 0.3 for e in errs["layers_part"]), errs  # random weights: errors grow with depth


def _time(fn, iters: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters / 1e3


def _rowwise(x: torch.Tensor, w: torch.Tensor):
    """The rowwise alternative (one scale per token, one per output channel; the weight requantised)."""
    xs = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
    ws = w.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
    xq = (x.float() / xs).clamp(-448, 448).to(fp8.E4M3)
    wq = (w.float() / ws).clamp(-448, 448).to(fp8.E4M3)
    return xq, xs, wq, ws.t().contiguous()


def test_projection_timing_at_the_27b_shapes():
    """Not asserted: seconds and TFLOP/s per projection for the lead's bench notes."""
    rows = {}
    x_all = torch.randn(TOKENS, max(k for _, k in SHAPES_27B), device=DEV, dtype=torch.bfloat16)
    for N, K in SHAPES_27B:
        x = x_all[:, :K].contiguous()
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        q, s = fp8.quantise(w)
        xq, xs = fp8.quantise_input(x)
        rq, rxs, rwq, rws = _rowwise(x, w)
        compiled = torch.compile(lambda h, q=q, s=s: fp8.block_linear(h, q, s))
        wq, ws = fp8_rows.quantise_rows(w)
        row_compiled = torch.compile(lambda h, q=wq, s=ws: fp8_rows.row_linear(h, q, s))
        t = {
            "bf16": _time(lambda x=x, w=w: F.linear(x, w)),
            "fp8_block_eager": _time(lambda x=x, q=q, s=s: fp8.block_linear(x, q, s)),
            "fp8_block_compiled": _time(lambda x=x, c=compiled: c(x)),
            "fp8_block_mm_only": _time(
                lambda q=q, s=s, xq=xq, xs=xs: fp8.fp8_block_mm(xq, xs, q, s, torch.bfloat16)
            ),
            "fp8_row_eager": _time(lambda x=x, q=wq, s=ws: fp8_rows.row_linear(x, q, s)),
            "fp8_row_compiled": _time(lambda x=x, c=row_compiled: c(x)),
            "fp8_row_op_only": _time(
                lambda q=wq, s=ws, xq=rq, xs=rxs: fp8_rows.fp8_row_mm(xq, xs, q, s, torch.bfloat16)
            ),
            "fp8_rowwise_mm_only": _time(
                lambda a=rq, sa=rxs, b=rwq, sb=rws: torch._scaled_mm(
                    a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
                )
            ),
        }
        flop = 2 * TOKENS * N * K
        rows[f"{N}x{K}"] = {k: {"s": round(v, 5), "tflops": round(flop / v / 1e12, 1)} for k, v in t.items()}
        rows[f"{N}x{K}"]["rowwise_vs_bf16_rel"] = rel(
            torch._scaled_mm(rq, rwq.t(), scale_a=rxs, scale_b=rws, out_dtype=torch.bfloat16), F.linear(x, w)
        )
        rows[f"{N}x{K}"]["block_vs_bf16_rel"] = rel(fp8.block_linear(x, q, s), F.linear(x, w))
        print(f"\n{N}x{K} at {TOKENS} tokens: {rows[f'{N}x{K}']}")
    _record("timing_27b_shapes", {"tokens": TOKENS, "device": torch.cuda.get_device_name(), "rows": rows})


def test_a_shape_cublas_refuses_runs_w8a8_emulated():
    """K = 384 (the h384 targets): no block-scaled matmul, the activations rounded as it would (W8A8)."""
    lin = torch.nn.Linear(384, 1152, bias=False, device=DEV, dtype=torch.bfloat16)
    m = fp8.Fp8Linear.from_linear(lin)
    assert not m.fast
    x = torch.randn(64, 384, device=DEV, dtype=torch.bfloat16)
    xq, xs = fp8.quantise_input(x)
    want = fp8.fp8_block_mm(xq.cpu(), xs.cpu(), m.weight.cpu(), m.weight_scale_inv.cpu(), torch.float32)
    assert rel(m(x).float().cpu(), want) < 1e-2
