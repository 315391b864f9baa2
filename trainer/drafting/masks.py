"""Anchor sampling and the DFlash attention masks (dense for SDPA, BlockMask for FlexAttention).

Layout. A packed row has ``T`` context positions (target hidden states) and ``A`` blocks of ``block_size``
slots. Block ``j`` holds the anchor token ``input_ids[anchors[j]]`` then ``block_size - 1`` mask tokens;
its slot ``k`` stands for position ``anchors[j] + k``. Queries: ``A * block_size`` block slots (block-major).
Keys: the ``T`` context positions first, then all ``A * block_size`` block slots.

Mask rule (one predicate, ``mask_mod``, used by both builders). Query = slot ``k`` of block ``j`` with
anchor ``a = anchors[j]``. It may attend
- context position ``p`` iff ``p < a`` (strictly: never the anchor's own position or later, whose target
  hidden state does not exist yet at inference), ``doc[p] == doc[a]`` (no crossing of a packed document
  boundary) and, on a sliding layer with window ``W``, ``(a + k) - p < W``. Window convention (the
  transformers one): a query at position ``q`` sees keys ``q - W + 1 .. q``, i.e. ``W`` positions
  counting itself; its own block is always fully visible regardless of ``W``;
- every slot of its own block (bidirectional);
- nothing else (no other block). A padding block (``a == -1``) sees only its own block, so no row of the
  mask is empty and no NaN appears.

``doc_ids`` are any integers, one per position; a document is a maximal run of equal ids (positions restart
and visibility stops at every change); ``doc_ids < 0`` marks padding, never used for anchors.

API: ``sample_anchors``, ``sample_run`` (one run of consecutive anchors per row), ``mask_mod``, ``dense_mask`` (bool ``(B, 1, Q, T + Q)``, True = may attend),
``flex_block_mask`` (a FlexAttention ``BlockMask`` over the same shapes).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def sample_anchors(
    doc_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    block_size: int,
    max_anchors: int,
    generator: torch.Generator | None = None,
    pad_to_max: bool = False,
    num_anchors: int | None = None,
    run_length: int = 1,
) -> torch.Tensor:
    """Random block anchors per row: ``(B, A)`` long, sorted ascending, ``-1`` = padding.

    Position ``a`` is a candidate iff the block ``[a, a + block_size - 1]`` fits in the row, lies in one
    document (``doc_ids >= 0``) and positions ``a + 1 .. a + block_size - 1`` (the predicted ones) are in
    ``loss_mask``. Up to ``max_anchors`` candidates per row are drawn without replacement;
    ``A = max(1, max over rows of the number drawn)`` (one device sync to read it), or with ``pad_to_max``
    ``A = min(max_anchors, T - block_size + 1)``: known from the shapes, so no sync and one shape for every
    batch of a length (no recompiles), at the cost of computing padding blocks where rows have fewer.
    ``num_anchors`` = ``anchor_count`` of the same rows, computed where they are on the host: the same ``A``
    without the device sync.

    ``run_length`` R > 1 draws runs instead of scattered positions: a row's candidates, in order, fall into
    groups of R consecutive ones; whole groups are drawn in random order until ``A`` anchors are taken (the
    last one cut). Every candidate is as likely to be drawn as with R = 1, but the anchors come in stretches
    where every position is one, and there the estimate's walk (drafting/acceptance.py) steps exactly as a
    decoding loop would: scattered anchors make it skip the hard positions after a rejection and over-read
    (docs/evaluate.md). But a drafter trained on runs learns less (accepted 20-22% less on the CPU bench): runs
    are for measuring. R = 1 is the references' sampling, unchanged draw for draw.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    if max_anchors < 1:
        raise ValueError(f"max_anchors must be >= 1, got {max_anchors}")
    if doc_ids.shape != loss_mask.shape or doc_ids.dim() != 2:
        raise ValueError(
            f"doc_ids {tuple(doc_ids.shape)} and loss_mask {tuple(loss_mask.shape)} must be (B, T)"
        )
    B, T = doc_ids.shape
    device = doc_ids.device
    n_cand = T - block_size + 1
    if n_cand <= 0:
        return torch.full((B, 1), -1, dtype=torch.long, device=device)
    if run_length < 1:
        raise ValueError(f"run_length must be >= 1, got {run_length}")
    valid = _candidates(doc_ids, loss_mask, block_size)
    gdev = generator.device if generator is not None else device
    if run_length == 1:
        scores = torch.rand((B, n_cand), generator=generator, device=gdev).to(device)
    else:  # one random key per group of R consecutive candidates; within a group, candidate order
        rank = valid.long().cumsum(1) - 1
        group = rank.clamp(min=0) // run_length
        n_groups = -(-n_cand // run_length)
        gkey = torch.rand((B, n_groups), generator=generator, device=gdev).to(device)
        gorder = gkey.argsort(dim=1).argsort(dim=1)  # each group's place in a random order
        key = gorder.gather(1, group) * run_length + rank % run_length
        scores = key.to(torch.float64) / float(n_groups * run_length)  # in [0, 1): exact for any real row
    scores = scores.masked_fill(~valid, 2.0)
    counts = valid.sum(1).clamp(max=max_anchors)
    if pad_to_max:
        A = min(max_anchors, n_cand)
    elif num_anchors is not None:
        A = num_anchors
    else:
        A = max(1, int(counts.max().item()))
    picked = scores.argsort(dim=1)[:, :A]
    keep = torch.arange(A, device=device).unsqueeze(0) < counts.unsqueeze(1)
    anchors = torch.where(keep, picked, torch.full_like(picked, n_cand + T))  # padding sorts last
    anchors = anchors.sort(dim=1).values
    return torch.where(anchors < n_cand, anchors, torch.full_like(anchors, -1))


def sample_run(
    doc_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    block_size: int,
    length: int,
    generator: torch.Generator | None = None,
    num_anchors: int | None = None,
) -> torch.Tensor:
    """One run of ``length`` consecutive candidates per row (``sample_anchors``' candidate rule), its start drawn
    uniformly among the row's candidates that leave room for the whole run (a row with fewer candidates gives
    all of them): ``(B, A)`` long, sorted ascending, ``-1`` = padding, ``A = num_anchors`` (``anchor_count(...,
    max_anchors=length)`` of the same rows) or read from the device. Where every position is an anchor the
    acceptance walk (drafting/acceptance.py) steps exactly as a decoding loop would: the trainer's measuring
    blocks (``--est-anchors``). One random number per row from ``generator``."""
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    B, T = doc_ids.shape
    device = doc_ids.device
    n_cand = T - block_size + 1
    if n_cand <= 0:
        return torch.full((B, 1), -1, dtype=torch.long, device=device)
    valid = _candidates(doc_ids, loss_mask, block_size)
    n = valid.sum(1)
    gdev = generator.device if generator is not None else device
    u = torch.rand((B,), generator=generator, device=gdev, dtype=torch.float64).to(device)
    start = (u * ((n - length).clamp(min=0) + 1)).long()  # uniform in 0 .. n - length
    rank = valid.long().cumsum(1) - 1
    take = valid & (rank >= start.unsqueeze(1)) & (rank < start.unsqueeze(1) + length)
    A = num_anchors if num_anchors is not None else max(1, int(take.sum(1).max().item()))
    pos = torch.arange(n_cand, device=device).expand(B, n_cand)
    picked = torch.where(take, pos, torch.full_like(pos, n_cand)).sort(dim=1).values[:, :A]
    if picked.shape[1] < A:
        picked = torch.nn.functional.pad(picked, (0, A - picked.shape[1]), value=n_cand)
    return torch.where(picked < n_cand, picked, torch.full_like(picked, -1))


def _candidates(doc_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """``(B, T - block_size + 1)`` bool: may an anchor sit at this position (``sample_anchors``' rule)."""
    n_cand = doc_ids.shape[1] - block_size + 1
    doc = doc_ids.long()
    lm = loss_mask.bool()
    # document changes: change[t] = doc[t] != doc[t-1]; block [a, a+bs-1] in one doc iff no change in (a, a+bs-1]
    change = torch.zeros_like(doc)
    change[:, 1:] = (doc[:, 1:] != doc[:, :-1]).long()
    cchange = change.cumsum(1)
    same_doc = cchange[:, block_size - 1 :] == cchange[:, :n_cand]
    # predicted positions a+1..a+bs-1 all in the loss mask
    clm = torch.nn.functional.pad(lm.long().cumsum(1), (1, 0))  # clm[t] = sum lm[:t]
    n_in = clm[:, block_size : block_size + n_cand] - clm[:, 1 : 1 + n_cand]
    return same_doc & (n_in == block_size - 1) & (doc[:, :n_cand] >= 0)


def anchor_count(doc_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int, max_anchors: int) -> int:
    """The ``A`` that ``sample_anchors`` gives these rows: pass it as ``num_anchors`` (from host copies of the
    rows) to spare the device sync of reading it there."""
    n_cand = doc_ids.shape[1] - block_size + 1
    if n_cand <= 0:
        return 1
    counts = _candidates(doc_ids, loss_mask, block_size).sum(1).clamp(max=max_anchors)
    return max(1, int(counts.max()))


def mask_mod(
    anchors: torch.Tensor, doc_ids: torch.Tensor, block_size: int, sliding_window: int | None = None
) -> Callable:
    """The DFlash mask predicate ``f(b, h, q_idx, kv_idx) -> bool`` (FlexAttention ``mask_mod`` form)."""
    anchors = anchors.long()
    doc = _runs(doc_ids)  # a document is a maximal run of equal doc_ids (as doc_positions and anchors see it)
    B, A = anchors.shape
    T = doc.shape[1]
    anchor_doc = torch.gather(doc, 1, anchors.clamp(min=0))  # irrelevant for padding blocks (p < -1 never)

    def mod(b, h, q_idx, kv_idx):
        j = (q_idx // block_size).clamp(max=A - 1)
        k = q_idx % block_size
        a = anchors[b, j]
        p = kv_idx.clamp(min=0, max=T - 1)
        ctx = (kv_idx < T) & (kv_idx < a) & (doc[b, p] == anchor_doc[b, j])
        if sliding_window is not None:
            ctx = ctx & (a + k - kv_idx < sliding_window)
        blk = (kv_idx >= T) & ((kv_idx - T) // block_size == j)
        return ctx | blk

    return mod


def _runs(doc_ids: torch.Tensor) -> torch.Tensor:
    """Run index per position: 0 for the first run of equal ``doc_ids`` of a row, then +1 at each change."""
    doc = doc_ids.long()
    change = torch.zeros_like(doc)
    change[:, 1:] = (doc[:, 1:] != doc[:, :-1]).long()
    return change.cumsum(1)


def dense_mask(
    anchors: torch.Tensor, doc_ids: torch.Tensor, block_size: int, sliding_window: int | None = None
) -> torch.Tensor:
    """Bool mask ``(B, 1, A*block_size, T + A*block_size)`` for SDPA; True = may attend."""
    B, A = anchors.shape
    T = doc_ids.shape[1]
    Q = A * block_size
    dev = anchors.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev)
    q = torch.arange(Q, device=dev).view(1, 1, Q, 1)
    kv = torch.arange(T + Q, device=dev).view(1, 1, 1, T + Q)
    return mask_mod(anchors, doc_ids, block_size, sliding_window)(b, h, q, kv)


def flex_block_mask(
    anchors: torch.Tensor,
    doc_ids: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
    device: torch.device | str | None = None,
):
    """FlexAttention ``BlockMask`` for the same rule (shapes as ``dense_mask``, heads broadcast).

    The 128x128 tile structure is computed from the anchors directly (``_tile_structure``: per slot, the
    visible context interval ``[lo, a)`` and its own block's keys), never by evaluating the predicate over
    all ``Q x (T + Q)`` pairs: no host sync, no compile, memory ``O(Q + tiles)``. Tiles that are only partly
    visible are marked partial and evaluated with ``mask_mod`` by the kernel, so the mask is exact."""
    from torch.nn.attention.flex_attention import BlockMask

    B, A = anchors.shape
    T = doc_ids.shape[1]
    Q = A * block_size
    dev = torch.device(device) if device is not None else anchors.device
    anchors = anchors.to(dev)
    doc_ids = doc_ids.to(dev)
    partial, full = _tile_structure(anchors, doc_ids, block_size, sliding_window, _TILE)

    def ordered(m: torch.Tensor):
        num = m.sum(-1, dtype=torch.int32).unsqueeze(1)
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32).unsqueeze(1)
        return num.contiguous(), idx.contiguous()

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=_TILE,
        mask_mod=mask_mod(anchors, doc_ids, block_size, sliding_window),
        seq_lengths=(Q, T + Q),
    )


_TILE = 128  # FlexAttention's default sparse block size (queries and keys)


def _tile_structure(anchors, doc_ids, block_size: int, sliding_window: int | None, tile: int):
    """(partial, full): bool ``(B, nQ, nKV)`` over ``tile x tile`` tiles of the (Q, T + Q) mask.

    ``partial | full`` is exactly the set of tiles with at least one visible pair; ``full`` only tiles
    where every pair is visible (all of its keys are context positions inside every slot's interval)."""
    B, A = anchors.shape
    T = doc_ids.shape[1]
    bs = block_size
    Q = A * bs
    KV = T + Q
    nQ, nKV = -(-Q // tile), -(-KV // tile)
    dev = anchors.device
    a = anchors.long()
    valid = a >= 0
    a0 = a.clamp(min=0)
    # start of the document of each position
    idx = torch.arange(T, device=dev).expand(B, T)
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    # per slot: context interval [lo, hi)
    k = torch.arange(bs, device=dev).view(1, 1, bs)
    hi = a0.unsqueeze(-1).expand(B, A, bs)
    lo = torch.gather(first, 1, a0).unsqueeze(-1).expand(B, A, bs)
    if sliding_window is not None:
        lo = torch.maximum(lo, hi + k - sliding_window + 1)
    has_ctx = (lo < hi) & valid.unsqueeze(-1)
    lo, hi, has_ctx = lo.reshape(B, Q), hi.reshape(B, Q), has_ctx.reshape(B, Q)
    slot = torch.arange(Q, device=dev)
    qt = (slot // tile).expand(B, Q)
    # non-empty tiles: +1 at the first key tile, -1 after the last, per slot; cumulative sum over key tiles
    diff = torch.zeros(B, nQ, nKV + 1, dtype=torch.int32, device=dev)
    one = has_ctx.to(torch.int32)
    flat = qt * (nKV + 1)
    diff.view(B, -1).scatter_add_(1, flat + lo.clamp(min=0) // tile, one)
    diff.view(B, -1).scatter_add_(1, flat + (hi - 1).clamp(min=0) // tile + 1, -one)
    jb = (slot // bs).expand(B, Q)  # own block's keys: [T + j*bs, T + (j+1)*bs)
    ones = torch.ones_like(one)
    diff.view(B, -1).scatter_add_(1, flat + (T + jb * bs) // tile, ones)
    diff.view(B, -1).scatter_add_(1, flat + (T + (jb + 1) * bs - 1) // tile + 1, -ones)
    nonempty = diff.cumsum(-1)[..., :nKV] > 0
    # full tiles: every slot of the query tile sees all of the key tile, which lies inside the context
    pad = nQ * tile - Q
    big = T + 1
    lo_f = torch.where(has_ctx, lo, torch.full_like(lo, big))
    hi_f = torch.where(has_ctx, hi, torch.full_like(hi, -1))
    lo_t = (
        torch.nn.functional.pad(lo_f, (0, pad), value=big).view(B, nQ, tile).amax(-1)
    )  # ragged last tile: never full
    hi_t = torch.nn.functional.pad(hi_f, (0, pad), value=-1).view(B, nQ, tile).amin(-1)
    kv0 = torch.arange(nKV, device=dev).view(1, 1, nKV) * tile
    full = (kv0 >= lo_t.unsqueeze(-1)) & (kv0 + tile <= hi_t.unsqueeze(-1)) & (kv0 + tile <= T) & nonempty
    return nonempty & ~full, full


def doc_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """Per-document positions ``(B, T)``: 0 at each document's first token (a change of ``doc_ids``)."""
    B, T = doc_ids.shape
    idx = torch.arange(T, device=doc_ids.device).expand(B, T)
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first
