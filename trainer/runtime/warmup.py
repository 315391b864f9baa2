"""The drafter's first step traced while the target is still loading (issue 22).

On CUDA the drafter's first micro-batch compiles (dynamo traces the layer step, the loss chunks and the
attention; warm caches only spare the kernels' generation): ~4 s of a warm restart at the 8B shape, spent
after the target was loaded and had captured its first batch. ``stand_in_batch`` makes a batch of the
exact shapes the first real one will have: the data of the run's first micro-batch (the plan at the data
cursor), random hidden states of the capture's shape and dtype; ``trace_first_step`` runs the drafter's
micro-step on it in the main thread while the target's load runs in its thread, holding the roles' launch
lock (the target's first capture, which compiles too, waits for it: torch.compile is not thread-safe), and
then leaves no trace: gradients dropped, the anchor/noise generator and torch's RNG as they were, a meter of
its own, no DDP wrapper (no collective: each replica traces its own first micro-batch). Where the target's head is not built yet (it is shared with the target on the same device), the
stand-in head has random weights of the head's shapes and dtype. The compiled code it leaves is what the
first real step would have made: same functions, same shapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainer.drafting.compiling import compile_enabled
from trainer.drafting.head import FrozenHead
from trainer.runtime.drafter_state import DrafterState
from trainer.runtime.hidden_queue import HiddenBatch

if TYPE_CHECKING:
    from trainer.runtime.roles import DrafterRole


def stand_in_batch(plan, g: int, cfg, device: str, dtype: torch.dtype, need_final: bool) -> HiddenBatch:
    """Micro-batch ``g``'s data with random hidden states shaped as the target's capture gives them."""
    mb = plan.batch(g)
    ids, lm, docs, _pos = mb.to_tensors("cpu")
    T, H, n = ids.shape[1], int(cfg.hidden_size), len(cfg.target_layer_ids)
    hidden = _randn((1, T, n * H), dtype, device)
    final = _randn((1, T, H), dtype, device) if need_final else None
    return HiddenBatch(mb.index, mb.epoch, mb.num_tokens, hidden, final, ids.to(device), lm, docs)


def _randn(shape, dtype: torch.dtype, device, scale: float = 1.0) -> torch.Tensor:
    """Values for a stand-in (any finite values trace alike): from a private generator, so torch's own RNG
    is not drawn from; not zeros, so that a step on them has gradients (a test sees any left behind)."""
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)


def stand_in_head(vocab_size: int, hidden_size: int, device: str, dtype: torch.dtype) -> FrozenHead:
    """An embedding and lm_head of the target's shapes, dtype and device (built without torch's init
    functions: another thread may be inside transformers' ``no_init_weights``, which swaps them process-wide)."""
    emb = nn.Embedding.from_pretrained(_randn((vocab_size, hidden_size), dtype, device, 0.02), freeze=True)
    lm_head = nn.Linear(hidden_size, vocab_size, bias=False, device="meta")
    lm_head.weight = nn.Parameter(_randn((vocab_size, hidden_size), dtype, device, 0.02), requires_grad=False)
    return FrozenHead(emb, nn.Identity(), lm_head)


def wanted(device: str) -> bool:
    """On CUDA with compilation on; anywhere while ``testing()`` (a test's seam)."""
    if testing():
        return True
    return str(device).startswith("cuda") and compile_enabled()


def testing() -> bool:
    """False: tests replace it to trace on the CPU too, and to see a failed trace raise."""
    return False


def trace_first_step(
    st: DrafterState,
    make_role: Callable[[FrozenHead], DrafterRole],
    device: str,
    target_dtype: torch.dtype,
    *,
    micro_batch: int,
    noise: float,
    scale: float,
    seed: int,
    need_final: bool,
) -> float | None:
    """Run the drafter's micro-step once on a stand-in of micro-batch ``micro_batch`` (the replica's next one),
    with the step's ``noise``, loss ``scale`` and anchor/noise ``seed``, through ``make_role(head)`` (a role
    over ``st``'s drafter, optimizer and generator, with a meter of its own and no DDP); seconds it took, or
    None where nothing compiles (CPU, compilation off) or no micro-batch is left."""
    g, dev, cfg = micro_batch, device, st.cfg
    if not wanted(dev) or g >= st.plan.total or st.step >= st.total_steps:
        return None
    t0 = time.monotonic()
    hb = stand_in_batch(st.plan, g, cfg, dev, target_dtype, need_final)
    head = st.head or stand_in_head(cfg.vocab_size, cfg.hidden_size, dev, st.head_dtype)
    role = make_role(head)
    cuda = str(dev).startswith("cuda")
    snap = (
        st.generator.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state(dev) if cuda else None,
    )
    try:
        out = role.micro_step(hb, noise, scale, seed=seed)
        del out
    finally:
        st.optimizer.zero_grad(set_to_none=True)
        st.generator.set_state(snap[0])
        torch.set_rng_state(snap[1])
        if cuda:
            torch.cuda.set_rng_state(snap[2], dev)
    if cuda:
        torch.cuda.synchronize(dev)
    return time.monotonic() - t0
