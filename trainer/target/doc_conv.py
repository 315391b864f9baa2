"""The per-document causal conv + SiLU of the hybrid fast path as Triton kernels (CUDA).

``conv_silu(x, weight, bias, taps)`` (the tile kernel) computes what ``hybrid._conv_silu`` (the reference, plain PyTorch) does,
``silu(sum_j w[:, K-1-j] * x[t-j] * taps[j-1, t] + bias)`` in fp32, and writes it in ``x``'s dtype: x (..., N, C)
flattened to (N, C) tokens, weight (C, K), taps (K-1, N) bool ("token t-j is in t's document"). Each program
loads one tile of BLOCK_T tokens x BLOCK_C channels and its K - 1 shifted copies (the shifted rows are the
tile's own, or K - 1 rows above it: read from cache), so memory traffic is one read of x and one write of the
output, where the reference's fused kernel (rolls masked by a bool per tap) ran at about a third of memory
speed on the H200 (issue 36).

``launch_rolling`` is a second kernel for the same contract (widths up to 4): each program walks a strip of
tokens row by row, keeping the K - 1 previous rows in registers, so each row is loaded once (the tile kernel
loads it K times, K - 1 of them from cache). Its ``reset`` variant takes a packed row's taps (documents
contiguous, as ``hybrid._flat_meta`` always gives them) and clears the kept rows where a document starts
instead of masking each tap at each row. On one H200 at the 27B shape (2026-12-04, third session, CUDA graph
replays of the kernels alone, bench/hybrid_conv.py) it ran 0.707-0.711 ms a layer, 1.50x and 1.52x the byte
floor, where the plain rolling kernel ran 1.82x and the tile kernel 1.97x; with 4 pipeline stages instead of 3
(fourth session's sweep) 0.647 ms, 1.37x. It is ``conv_silu_packed``, the one
the capture uses where it checks (``select``); the tile kernel (``conv_silu``, any taps) is the fallback.

Both are ``torch.library.triton_op``s (compiled regions keep them whole and see the kernel). ``usable(x, taps)``
says whether a call's tensors fit them (CUDA; float16 / bfloat16 / float32); ``select(device, reference, K)``
runs each, in ``KERNELS``' order, once against the reference on a small packed input (every tap, documents of 1
token and shorter than K, a partial tile), eagerly and inside a compiled region (as the capture calls it), and
remembers the first that passed, so a device where a kernel is wrong or fails to build or to lower (or has no
Triton) gets the next one, and the reference after the last: ``hybrid.prepare_hybrid`` uses what it selects.
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # a tuple: compiled regions read it
# tokens and channels per program: the best of bench/hybrid_conv.py's sweep on one H200 (2026-12-04, the 27B
# shape's 10,240 channels at 49,152 tokens: 0.944 ms a layer, against 1.071 ms at the earlier 64 x 128)
BLOCK_T, BLOCK_C, WARPS = 16, 256, 4
ROLLING_MAX_K = 4  # the rolling kernel's widest conv (Qwen3.5 / 3.6: 4)
# the rolling kernel's strip (tokens x channels), warps and pipeline stages: the sweep's best (1,024 bf16
# channels on 128 threads: 16-byte loads)
ROLL_T, ROLL_C, ROLL_WARPS, ROLL_STAGES = 64, 1024, 4, 3
# the reset variant's strip for the capture (``conv_silu_packed``): the best of three sweeps on one H200
# (2026-12-04; 4 stages: 1.37x the floor, 3 stages: 1.51x in the same call)
PACKED_T, PACKED_C, PACKED_WARPS, PACKED_STAGES = 64, 512, 2, 4
_selected: dict[tuple[str, int], str | None] = {}  # (device, width K) -> the kernel that equals the reference


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def usable(x: torch.Tensor, taps: torch.Tensor | None) -> bool:
    """Whether the kernel takes this call's tensors (a conv of width > 1 on CUDA in a supported dtype); that it
    is correct on the device is ``check``'s (called once before, outside any compiled region)."""
    return taps is not None and x.is_cuda and x.dtype in DTYPES and x.shape[-1] > 0


if triton_available():
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton

    @triton.jit
    def doc_conv_silu_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        taps_ptr,
        out_ptr,
        N,
        C,
        stride_x,
        stride_w,
        stride_taps,
        K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BT: tl.constexpr,
        BC: tl.constexpr,
    ):
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        c = tl.program_id(1) * BC + tl.arange(0, BC)
        tm, cm = t < N, c < C
        rows = t.to(tl.int64) * stride_x
        wc = c.to(tl.int64) * stride_w
        x = tl.load(x_ptr + rows[:, None] + c[None, :], mask=tm[:, None] & cm[None, :], other=0.0)
        w_last = tl.load(w_ptr + wc + (K - 1), mask=cm, other=0.0).to(tl.float32)
        acc = x.to(tl.float32) * w_last[None, :]
        for j in tl.static_range(1, K):
            tap = tl.load(taps_ptr + (j - 1) * stride_taps + t, mask=tm, other=0) != 0
            src = (t - j).to(tl.int64) * stride_x
            xj = tl.load(x_ptr + src[:, None] + c[None, :], mask=tap[:, None] & cm[None, :], other=0.0)
            wj = tl.load(w_ptr + wc + (K - 1 - j), mask=cm, other=0.0).to(tl.float32)
            acc = acc + xj.to(tl.float32) * wj[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
        y = acc * tl.sigmoid(acc)
        out_rows = t.to(tl.int64) * C
        tl.store(
            out_ptr + out_rows[:, None] + c[None, :],
            y.to(out_ptr.dtype.element_ty),
            mask=tm[:, None] & cm[None, :],
        )

    @triton.jit
    def _halo(x_ptr, taps_ptr, t0, j: tl.constexpr, c, cm, N, stride_x, stride_taps, RESET: tl.constexpr):
        """Row t0 - j of x in fp32 (0 before the row's start); with ``RESET``, 0 too where it is not in row t0's
        document (``taps[j - 1, t0]``): the rolling loop then only clears its rows at a document's start."""
        p = tl.load(x_ptr + (t0 - j).to(tl.int64) * stride_x + c, mask=cm & (t0 >= j), other=0.0)
        p = p.to(tl.float32)
        if RESET:
            p = p * tl.load(taps_ptr + (j - 1) * stride_taps + t0, mask=t0 < N, other=0).to(tl.float32)
        return p

    @triton.jit
    def doc_conv_silu_rolling_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        taps_ptr,
        out_ptr,
        N,
        C,
        stride_x,
        stride_w,
        stride_taps,
        K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BT: tl.constexpr,
        BC: tl.constexpr,
        STAGES: tl.constexpr,
        RESET: tl.constexpr,
    ):
        """The same conv (K <= 4) walked token by token over a strip of BT tokens x BC channels: each row of x
        is read from memory once, its K - 1 predecessors are the last rows, kept in registers. ``RESET``: the
        taps are a packed row's (documents contiguous, so ``taps[j, t]`` implies ``taps[j - 1, t]``): instead
        of masking each tap at each row, the kept rows are cleared where a document starts (``taps[0, t]``
        off), one load and no multiply a row (a variant the sweep times)."""
        t0 = tl.program_id(0) * BT
        c = tl.program_id(1) * BC + tl.arange(0, BC)
        cm = c < C
        wc = c.to(tl.int64) * stride_w
        zero = tl.zeros([BC], dtype=tl.float32)
        w3 = tl.load(w_ptr + wc + (K - 1), mask=cm, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + wc + (K - 2), mask=cm, other=0.0).to(tl.float32)
        w1, w0, p2, p3, bias = zero, zero, zero, zero, zero
        p1 = _halo(x_ptr, taps_ptr, t0, 1, c, cm, N, stride_x, stride_taps, RESET)
        if K > 2:
            w1 = tl.load(w_ptr + wc + (K - 3), mask=cm, other=0.0).to(tl.float32)
            p2 = _halo(x_ptr, taps_ptr, t0, 2, c, cm, N, stride_x, stride_taps, RESET)
        if K > 3:
            w0 = tl.load(w_ptr + wc + (K - 4), mask=cm, other=0.0).to(tl.float32)
            p3 = _halo(x_ptr, taps_ptr, t0, 3, c, cm, N, stride_x, stride_taps, RESET)
        if HAS_BIAS:
            bias = tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
        for i in tl.range(0, BT, num_stages=STAGES):
            t = t0 + i
            live = t < N
            m = cm & live
            x = tl.load(x_ptr + t.to(tl.int64) * stride_x + c, mask=m, other=0.0).to(tl.float32)
            if RESET:
                if tl.load(taps_ptr + t, mask=live, other=1) == 0:  # a document starts at t
                    p1 = zero
                    p2 = zero
                    p3 = zero
                acc = x * w3 + bias + p1 * w2
                if K > 2:
                    acc += p2 * w1
                if K > 3:
                    acc += p3 * w0
            else:
                acc = x * w3 + bias + tl.load(taps_ptr + t, mask=live, other=0).to(tl.float32) * p1 * w2
                if K > 2:
                    acc += tl.load(taps_ptr + stride_taps + t, mask=live, other=0).to(tl.float32) * p2 * w1
                if K > 3:
                    acc += (
                        tl.load(taps_ptr + 2 * stride_taps + t, mask=live, other=0).to(tl.float32) * p3 * w0
                    )
            y = acc * tl.sigmoid(acc)
            tl.store(out_ptr + t.to(tl.int64) * C + c, y.to(out_ptr.dtype.element_ty), mask=m)
            p3 = p2
            p2 = p1
            p1 = x

    def _launch(kernel, x, weight, bias, taps, block_t: int, block_c: int, warps: int, **constexprs):
        """``kernel`` on x (..., N, C) -> (..., N, C) in x's dtype, one program a block_t x block_c tile."""
        C = x.shape[-1]
        x2 = x.reshape(-1, C)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        N = x2.shape[0]
        K = weight.shape[-1]
        # a copy, not a view: inductor cannot lower a bool -> uint8 view inside a compiled region
        taps = taps.to(torch.uint8).contiguous() if K > 1 else x2.new_zeros(1, 1, dtype=torch.uint8)
        if weight.stride(-1) != 1:
            weight = weight.contiguous()
        out = torch.empty((N, C), dtype=x.dtype, device=x.device)
        bc = min(block_c, max(16, triton.next_power_of_2(C)))
        grid = (triton.cdiv(N, block_t), triton.cdiv(C, bc))
        wrap_triton(kernel)[grid](
            x2, weight, weight if bias is None else bias, taps, out, N, C, x2.stride(0), weight.stride(0),
            taps.stride(0), K=K, HAS_BIAS=bias is not None, BT=block_t, BC=bc, num_warps=warps, **constexprs,
        )  # fmt: skip
        return out.view(x.shape)

    def launch(x, weight, bias, taps, block_t: int = BLOCK_T, block_c: int = BLOCK_C, warps: int = WARPS):
        """The tile kernel on x (..., N, C) -> (..., N, C); the tile sizes as given (the bench sweeps)."""
        return _launch(doc_conv_silu_kernel, x, weight, bias, taps, block_t, block_c, warps)

    def launch_rolling(
        x,
        weight,
        bias,
        taps,
        block_t=ROLL_T,
        block_c=ROLL_C,
        warps=ROLL_WARPS,
        stages=ROLL_STAGES,
        reset=False,
    ):
        """``launch``'s contract through the rolling kernel (a conv of width 2 .. ``ROLLING_MAX_K``); ``reset``:
        its variant for a packed row's taps (documents contiguous), the kernel's docstring."""
        K = weight.shape[-1]
        if not 2 <= K <= ROLLING_MAX_K:
            raise ValueError(f"the rolling conv kernel takes widths 2 .. {ROLLING_MAX_K}, not {K}")
        kernel = doc_conv_silu_rolling_kernel
        return _launch(kernel, x, weight, bias, taps, block_t, block_c, warps, STAGES=stages, RESET=reset)

    @triton_op("dflash::doc_conv_silu", mutates_args=())
    def _doc_conv_silu(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, taps: torch.Tensor
    ) -> torch.Tensor:
        return launch(x, weight, bias, taps)

    @triton_op("dflash::doc_conv_silu_packed", mutates_args=())
    def _doc_conv_silu_packed(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, taps: torch.Tensor
    ) -> torch.Tensor:
        return launch_rolling(x, weight, bias, taps, PACKED_T, PACKED_C, PACKED_WARPS, PACKED_STAGES, True)


def conv_silu(x: torch.Tensor, weight: torch.Tensor, bias, taps: torch.Tensor) -> torch.Tensor:
    """The tile kernel (``usable`` must hold): silu(per-document conv) in x's dtype, for any taps."""
    return torch.ops.dflash.doc_conv_silu(x, weight, bias, taps)


def conv_silu_packed(x: torch.Tensor, weight: torch.Tensor, bias, taps: torch.Tensor) -> torch.Tensor:
    """``conv_silu`` by the rolling kernel's reset variant, for a packed row's taps only (documents contiguous:
    ``taps[j, t]`` implies ``taps[j - 1, t]``, as ``hybrid._flat_meta`` gives them); widths 2 .. ``ROLLING_MAX_K``."""
    return torch.ops.dflash.doc_conv_silu_packed(x, weight, bias, taps)


# the kernels ``select`` tries, in order, with the widest conv each takes
KERNELS = {"rolling": (conv_silu_packed, ROLLING_MAX_K), "tile": (conv_silu, None)}


def check_inputs(device, K: int, C: int = 200):
    """A small packed row (documents of 70, 1, 2, 3, 140 tokens: 1 token, shorter than K, partial tiles) and
    its taps, on ``device``."""
    lens = (70, 1, 2, 3, 140)
    N = sum(lens)
    g = torch.Generator().manual_seed(0)
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    idx = torch.arange(N)
    taps = torch.stack([(idx >= j) & (seg == seg.roll(j)) for j in range(1, K)])
    x = torch.randn(1, N, C, generator=g)
    w, b = torch.randn(C, K, generator=g), torch.randn(C, generator=g)
    return tuple(t.to(device) for t in (x, w, b, taps))


def select(device, reference, K: int = 4) -> str | None:
    """The first of ``KERNELS`` that equals ``reference`` (``hybrid._conv_silu``: fp32 out) on ``device`` at
    width ``K`` (with and without bias, bf16 and fp32, eagerly; bf16 inside a compiled region), or None;
    remembered per device and width. Each kernel passed over is warned about once (the next one, or the
    reference after the last, is used instead)."""
    key = (str(torch.device(device)), K)
    if key not in _selected:
        _selected[key] = _first_passing(device, reference, K)
    return _selected[key]


def _first_passing(device, reference, K: int) -> str | None:
    dev = torch.device(device)
    if dev.type != "cuda" or K < 2:
        return None  # the CPU or no conv: the reference, silently (nothing to warn about)
    if not triton_available():
        warnings.warn(f"per-document conv: no Triton kernel on {dev} (Triton is not installed)", stacklevel=3)
        return None
    for name, (kernel, widest) in KERNELS.items():
        if widest is not None and widest < K:
            continue
        try:
            # eagerly, then inside a compiled region as the capture calls it (a lowering error there once
            # killed every hybrid capture at step 1)
            ok, why = compare(device, reference, kernel, K)
            if ok:
                ok, why = compiled_ok(device, reference, K, kernel)
        except Exception as e:  # noqa: BLE001 - a kernel that does not build: the next one
            ok, why = False, f"{type(e).__name__}: {str(e)[:300]}"
        if ok:
            return name
        warnings.warn(f"per-document conv: the {name} kernel is not used on {dev} ({why})", stacklevel=3)
    return None


def check(device, reference, K: int = 4) -> bool:
    """Whether one of the kernels equals ``reference`` on ``device`` at width ``K`` (``select``)."""
    return select(device, reference, K) is not None


def compiled_ok(device, reference, K: int, kernel=conv_silu) -> tuple[bool, str]:
    """(whether ``kernel`` inside a compiled region equals ``reference``, bf16 without bias as the Gated
    DeltaNet conv runs, on ``check_inputs``; why not)."""
    x, w, _b, taps = check_inputs(device, K)
    xd, wd = x.to(torch.bfloat16), w.to(torch.bfloat16)
    got = torch.compile(kernel, fullgraph=True, dynamic=False)(xd, wd, None, taps).float()
    want = reference(xd, wd, None, taps).to(torch.bfloat16).float()
    err = float((got - want).abs().max() / want.abs().max().clamp(min=1e-12))
    return (True, "") if err <= 1e-2 else (False, f"compiled: max error {err:.2e} > 1e-2")


def compare(device, reference, kernel, K: int) -> tuple[bool, str]:
    """(whether ``kernel`` equals ``reference`` on ``check``'s inputs, why not)."""
    x, w, b, taps = check_inputs(device, K)
    for dt in (torch.float32, torch.bfloat16):
        for bias in (b, None):
            xd, wd = x.to(dt), w.to(dt)
            got = kernel(xd, wd, None if bias is None else bias.to(dt), taps).float()
            want = reference(xd, wd, None if bias is None else bias.to(dt), taps).to(dt).float()
            tol = 1e-5 if dt == torch.float32 else 1e-2
            err = float((got - want).abs().max() / want.abs().max().clamp(min=1e-12))
            if not err <= tol:
                return False, f"{dt}, bias {bias is not None}: max error {err:.2e} > {tol}"
    return True, ""
