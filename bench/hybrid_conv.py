"""bench_hybrid.py's ``conv`` step: the per-document causal conv + SiLU of a Gated DeltaNet layer, the
reference (``hybrid._conv_silu``, the shifted taps, compiled as the fast path's region has it) against
``doc_conv``'s Triton kernel that the capture selects (``doc_conv.select``: the rolling kernel's packed-row
variant where it checks, else the tile kernel), at the bench's token count and the target's q / k / v widths,
with the byte floor.

Per layer: three tensors (q and k of ``key_dim`` channels, v of ``value_dim``), each (1, N, C) bf16 as the
projections leave them, weight (C, K) bf16, taps (K - 1, N) bool from the packed row's documents. Bytes = one
read of each input and one write of each output (+ the taps and weights); bandwidth = a big device copy in
the same step (2 x bytes / time); floor = bytes / bandwidth. Per call = per layer x the Gated DeltaNet layers
a call runs. Both kernels are also timed at a few strip and tile sizes (``sweep``; the capture's are
``doc_conv.PACKED_*`` and ``BLOCK_*``), and ``copy_same_tensors`` is a plain copy of the same three tensors (the floor's bytes
at these sizes and launch count: 1.03x the floor on one H200, 2026-12-04). On CUDA every figure is a CUDA graph's
replay (the kernels' own time; ``kernel_s_per_layer_eager`` beside it: the calls timed as issued). On the CPU
(``--tiny``) only the reference runs (eager).
"""

from __future__ import annotations

import torch

from bench.prof import device_timed, sync, timed
from trainer.target import doc_conv
from trainer.target.hybrid import _conv_silu, _flat_meta

# (kernel, tokens, channels, warps, pipeline stages): the tile kernel around its best (16 x 256, 4 warps: 1.97x
# the floor), the rolling kernel (doc_conv.launch_rolling: 64 x 1,024, 4 warps, 3 stages: 1.82x) and its reset
# variant (64 x 512, 2 warps, 3 stages: 1.50x and 1.52x; 4 stages: 1.37x, the capture's since; one H200,
# 2026-12-04, five calls)
SWEEP = (
    ("tile", 64, 128, 4, 0),
    ("tile", 16, 256, 4, 0),
    ("tile", 8, 256, 4, 0),
    ("tile", 32, 256, 4, 0),
    ("tile", 16, 512, 4, 0),
    ("tile", 8, 512, 4, 0),
    ("rolling", 256, 512, 4, 2),
    ("rolling", 128, 256, 4, 2),
    ("rolling", 512, 1024, 8, 3),
    ("rolling", 256, 128, 4, 3),
    ("rolling", 64, 1024, 4, 3),  # 1,024 channels on 128 threads: 16-byte loads
    ("rolling", 32, 1024, 4, 2),
    ("rolling", 128, 1024, 4, 4),
    ("rolling", 64, 512, 2, 3),
    ("rolling", 64, 2048, 8, 3),
    ("rolling", 64, 1024, 2, 4),
    ("rolling", 128, 1024, 4, 6),
    ("rolling_reset", 64, 1024, 4, 3),  # the kept rows cleared at a document's start, no tap masks
    ("rolling_reset", 64, 512, 2, 3),
    ("rolling_reset", 128, 512, 2, 3),  # around it
    ("rolling_reset", 32, 512, 2, 3),
    ("rolling_reset", 64, 256, 1, 3),
    ("rolling_reset", 64, 512, 4, 3),
    ("rolling_reset", 64, 512, 2, 4),
    ("rolling_reset", 64, 512, 2, 2),
    ("rolling_reset", 256, 512, 2, 3),
    ("rolling_reset", 128, 1024, 4, 3),
    ("rolling_reset", 16, 512, 2, 3),
    ("rolling_reset", 32, 256, 1, 3),
    ("rolling_reset", 64, 512, 2, 5),  # around 4 stages
    ("rolling_reset", 64, 512, 2, 6),
    ("rolling_reset", 64, 256, 1, 4),
    ("rolling_reset", 32, 512, 2, 4),
    ("rolling_reset", 128, 512, 2, 4),
    ("rolling_reset", 64, 1024, 4, 4),
)
COPY_BYTES = 4 << 30  # the bandwidth copy: 4 GiB read + 4 GiB written


def copy_bandwidth(device: str, nbytes: int = COPY_BYTES, reps: int = 10) -> float:
    """Bytes per second of a device copy (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), reps, 2)["s_per_iter"]
    return 2 * nbytes / t


def layer_inputs(cfg, doc: torch.Tensor, device: str, dtype):
    """One layer's q, k, v inputs (1, N, C), their conv weights (C, K) and the row's taps."""
    K = cfg.linear_conv_kernel_dim
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    N = doc.numel()
    g = torch.Generator(device=device).manual_seed(0)
    xs = [torch.randn(1, N, c, device=device, dtype=dtype, generator=g) for c in (kd, kd, vd)]
    ws = [torch.randn(c, K, device=device, dtype=dtype, generator=g) * 0.5 for c in (kd, kd, vd)]
    taps = _flat_meta(doc, K)[2].to(device)
    return xs, ws, taps


def layer_bytes(xs, ws, taps) -> int:
    """One read of each input and one write of each output, the weights and the taps."""
    io = sum(2 * x.numel() * x.element_size() for x in xs)
    return io + sum(w.numel() * w.element_size() for w in ws) + taps.numel() * taps.element_size()


def _time_layer(fn, xs, ws, taps, iters: int, eager: bool = False) -> float:
    """Seconds a layer (its three convs): replayed from a CUDA graph where it can be (the kernels' own time;
    two calls on one H200 timed eagerly put the same tile 1.98x and 2.45x the floor, 2026-12-04), else, or with
    ``eager``, calls timed by events (what the host's launches add included)."""

    def one():
        for x, w in zip(xs, ws, strict=True):
            fn(x, w, None, taps)

    return device_timed(one, iters, eager)


def copy_same(xs) -> float:
    """Seconds a layer for a plain device copy of the same tensors, one copy each (what the kernel's reads and
    writes cost at these sizes with nothing computed: the floor these launches can reach)."""
    outs = [torch.empty_like(x) for x in xs]

    def one():
        for x, o in zip(xs, outs, strict=True):
            o.copy_(x)

    return device_timed(one, 20)


def _reference(compiled: bool):
    def ref(x, w, b, taps):
        return _conv_silu(x, w, b, taps).to(x.dtype)

    return torch.compile(ref, dynamic=False) if compiled else ref


def equality(xs, ws, taps, ref, kernel=doc_conv.conv_silu) -> dict:
    """The kernel's outputs against the reference's: max relative error, share of elements that differ."""
    errs, diff, total = [], 0, 0
    for x, w in zip(xs, ws, strict=True):
        got, want = kernel(x, w, None, taps), ref(x, w, None, taps)
        errs.append(float((got.float() - want.float()).abs().max() / want.float().abs().max()))
        diff += int((got != want).sum())
        total += got.numel()
    return {"max_rel_err": max(errs), "share_differing": diff / total}


def _variant(kernel: str, bt: int, bc: int, nw: int, stages: int):
    if kernel.startswith("rolling"):
        reset = kernel == "rolling_reset"
        return lambda x, w, b, t: doc_conv.launch_rolling(x, w, b, t, bt, bc, nw, stages, reset)
    return lambda x, w, b, t: doc_conv.launch(x, w, b, t, bt, bc, nw)


def sweep(xs, ws, taps, iters: int, ref) -> list[dict]:
    """Each SWEEP variant's time per layer and its largest error against ``ref`` (a wrong one is not timed)."""
    rows = []
    for kernel, bt, bc, nw, stages in SWEEP:
        row = {"kernel": kernel, "block_t": bt, "block_c": bc, "warps": nw, "stages": stages}
        fn = _variant(kernel, bt, bc, nw, stages)
        try:
            row["max_rel_err"] = equality(xs, ws, taps, ref, fn)["max_rel_err"]
            if row["max_rel_err"] <= 1e-2:
                row["s_per_layer"] = _time_layer(fn, xs, ws, taps, iters)
        except Exception as e:  # noqa: BLE001 - a variant that does not build: noted, the others go on
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    return rows


def conv_step(cfg, doc: torch.Tensor, device: str, n_linear: int, iters: int = 20) -> dict:
    """The step's entry (module docstring); ``n_linear``: Gated DeltaNet layers per call."""
    cuda = device == "cuda"
    xs, ws, taps = layer_inputs(cfg, doc, device, torch.bfloat16 if cuda else torch.float32)
    nbytes = layer_bytes(xs, ws, taps)
    bw = copy_bandwidth(device, COPY_BYTES if cuda else 64 << 20)
    floor = nbytes / bw
    ref = _reference(cuda)
    old = _time_layer(ref, xs, ws, taps, iters)
    e = {
        "tokens": doc.numel(),
        "channels": [x.shape[-1] for x in xs],
        "width": cfg.linear_conv_kernel_dim,
        "linear_layers_per_call": n_linear,
        "bytes_per_layer": nbytes,
        "copy_bandwidth_gb_s": bw / 1e9,
        "floor_s_per_layer": floor,
        "reference_s_per_layer": old,
        "reference_s_per_call": old * n_linear,
        "reference_vs_floor": old / floor,
        "copy_same_tensors_s_per_layer": (same := copy_same(xs)),
        "copy_same_tensors_vs_floor": same / floor,
        "reference": "compiled _conv_silu (shifted taps)" if cuda else "eager _conv_silu (CPU)",
    }
    name = doc_conv.select(device, _conv_silu, cfg.linear_conv_kernel_dim) if cuda else None
    if name is None:
        e["kernel"] = "not run: " + ("the self-check failed (warning above)" if cuda else "CPU (no Triton)")
        return e
    kernel = doc_conv.KERNELS[name][0]
    e.update(equality(xs, ws, taps, ref, kernel))
    new = _time_layer(kernel, xs, ws, taps, iters)
    e.update(
        kernel=name,
        timing="CUDA graph replay" if cuda else "eager",
        kernel_s_per_layer=new,
        kernel_s_per_layer_eager=_time_layer(kernel, xs, ws, taps, iters, eager=True),
        kernel_s_per_call=new * n_linear,
        kernel_vs_floor=new / floor,
        speedup=old / new,
        goal_vs_floor=1.5,
        goal_met=new / floor <= 1.5,
        sweep=sweep(xs, ws, taps, iters, ref),
    )
    sync()
    return e
