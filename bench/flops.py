"""FLOP accounting and the ceilings the trainer benches compare against.

Convention (issue 8): a matmul with ``P`` weights costs ``2 * P`` FLOPs per row forward; in training its
backward costs ``2 * P`` for the weight gradient (trainable weights only) plus ``2 * P`` for the input
gradient (only where the input needs one), so a trainable layer inside the graph costs the usual 6. What is
counted is what the step really multiplies: the drafter's ``fc`` has no input gradient (the target's hidden
states need none), the frozen ``lm_head`` no weight gradient. Attention costs ``4 * heads * head_dim`` per
allowed (query, key) pair forward (QK^T and PV) under the actual mask, 3x that in training (the
kernel's backward recomputation is not counted). Norms, RoPE and softmax are not counted.

``measure_matmul_tflops()``: an 8192^3 bf16 matmul on the device (random data, median of timed runs), the
measured ceiling; ``DATASHEET_BF16_TFLOPS`` = 989 (H100/H200 SXM dense bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DATASHEET_BF16_TFLOPS = 989.0


@dataclass
class Shape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def attn_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = self.hidden * self.kv_heads * self.head_dim
        return 2 * q + 2 * kv  # q, o, k, v

    @property
    def kv_params(self) -> int:
        return 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        return self.attn_params + 3 * self.hidden * self.intermediate

    def attn_pair_flops(self) -> int:
        """Forward FLOPs per allowed (query, key) pair in one layer."""
        return 4 * self.heads * self.head_dim


QWEN3_8B = Shape(hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936)


def causal_pairs(doc_ids: torch.Tensor, window: int | None = None) -> int:
    """Allowed (q, k) pairs of causal attention within each document of packed rows ``(B, T)``."""
    total = 0
    for row in doc_ids.cpu().tolist():
        start = 0
        for t in range(1, len(row) + 1):
            if t == len(row) or row[t] != row[t - 1]:
                n = t - start
                if window is None or window >= n:
                    total += n * (n + 1) // 2
                else:
                    total += window * (window + 1) // 2 + (n - window) * window
                start = t
    return total


def target_capture_flops(shape: Shape, n_layers: int, tokens: int, pairs: int) -> int:
    """Forward FLOPs of ``n_layers`` decoder layers on ``tokens`` tokens with ``pairs`` allowed pairs/layer."""
    return n_layers * (2 * shape.layer_params * tokens + shape.attn_pair_flops() * pairs)


def drafter_pairs(
    anchors: torch.Tensor, doc_ids: torch.Tensor, block_size: int, window: int | None = None
) -> int:
    """Allowed (query, key) pairs of the DFlash mask (trainer.drafting.masks rule), summed over rows and slots."""
    anchors = anchors.long().cpu()
    doc = doc_ids.long().cpu()
    B, T = doc.shape
    idx = torch.arange(T).expand(B, T)
    start = torch.ones_like(doc, dtype=torch.bool)
    start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(1).values  # doc start of each position
    valid = anchors >= 0
    a = anchors.clamp(min=0)
    s = torch.gather(first, 1, a)
    k = torch.arange(block_size).view(1, 1, -1)
    lo = s.unsqueeze(-1).expand(-1, -1, block_size)
    if window is not None:
        lo = torch.maximum(lo, a.unsqueeze(-1) + k - window + 1)
    ctx = (a.unsqueeze(-1) - lo).clamp(min=0) * valid.unsqueeze(-1)
    return int(ctx.sum()) + anchors.numel() * block_size * block_size


def drafter_step_flops(
    shape: Shape,
    n_layers: int,
    n_captured: int,
    ctx_tokens: int,
    query_slots: int,
    scored_slots: int,
    pairs_per_layer: int,
    soft_labels: bool = False,
) -> dict[str, int]:
    """Training FLOPs of one drafter step (forward + backward), by part.

    ``ctx_tokens``: context positions (target hidden states); ``query_slots``: all block slots computed
    (``A * block_size`` per row, padding blocks included); ``scored_slots``: slots through the lm_head
    (``A * (block_size - 1)``); ``pairs_per_layer``: allowed attention pairs in one layer."""
    H = shape.hidden
    fc = n_captured * H * H
    parts = {
        "fc": 4 * fc * ctx_tokens,  # forward + weight grad (no input grad)
        "ctx_kv": 6 * n_layers * shape.kv_params * ctx_tokens,
        "layers": 6 * n_layers * shape.layer_params * query_slots,
        "attention": 3 * n_layers * shape.attn_pair_flops() * pairs_per_layer,
        # logits + the input gradient (computed in the loss's forward); frozen: no weight grad
        "lm_head": (4 + (2 if soft_labels else 0)) * H * shape.vocab * scored_slots,
    }
    parts["total"] = sum(parts.values())
    return parts


def dflash2_extra_flops(
    shape: Shape,
    n_layers: int,
    query_slots: int,
    scored_slots: int,
    kernel: int,
    group: int,
    rank: int,
    top_k: int,
) -> dict[str, int]:
    """The matmul FLOPs DFlash 2 adds to a training step (forward + backward), by part: the convolutions'
    ``kernel_projection`` (two per layer, ``H -> 2 * kernel * H / group``, on every block slot); the selector's
    ``hidden_projection`` (``H -> rank``) and bilinear term (``top_k`` candidates of ``rank``) on the scored
    slots. The top-k candidates come from the loss's own logits (no second ``lm_head`` pass); elementwise
    work and the top-k selection are not counted."""
    H = shape.hidden
    proj = 2 * kernel * (H // group)
    return {
        "dflash2_conv": 6 * n_layers * 2 * H * proj * query_slots,
        "dflash2_selector": 6 * (H * rank + top_k * rank) * scored_slots,
    }


def measure_matmul_tflops(device="cuda", n: int = 8192, reps: int = 20) -> float:
    """Median bf16 ``n x n x n`` matmul rate on random data, TFLOP/s."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.matmul(a, b, out=c)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def rates(flops: float, seconds: float, matmul_tflops: float | None) -> dict[str, float]:
    """TFLOP/s and its fraction of the measured and datasheet ceilings."""
    tf = flops / seconds / 1e12
    out = {"tflops": tf, "mfu_datasheet": tf / DATASHEET_BF16_TFLOPS}
    if matmul_tflops:
        out["mfu_measured"] = tf / matmul_tflops
    return out
