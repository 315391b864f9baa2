"""Per-document attention for the trainer's own layer loops (``direct.py``, ``hybrid.py``), and the document
metadata it reads: causal within each document of a packed row, never across one.

- ``attend(q, k, v, scale, window, attn, meta)``: ``attn`` is one of ``ATTN_MODES``: ``"varlen"`` (torch's
  flash varlen kernel over the flattened rows; ``meta`` = ``varlen_meta``'s ``(cu_seqlens, max_len)``),
  ``"flex"`` (FlexAttention; ``meta`` = ``flex_mask``'s BlockMask), ``"sdpa"`` (a dense document-causal mask,
  ``dense_mask``; CPU / reference) or ``"sdpa_causal"`` (plain causal: ONLY rows of one document each).
  ``window``: a sliding layer's W keys, counting the query itself (transformers' convention); None = full.
- ``varlen_works(device)``: whether this torch's varlen kernel runs and is right on ``device``.
- ``doc_starts(doc)``: where a document starts in each row of ``doc`` (B, T); each row's first token does.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from trainer.drafting.flex import flex_attention

ATTN_MODES = ("varlen", "flex", "sdpa", "sdpa_causal")


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


# the keyword arguments this torch's varlen_attn takes (read once, outside any compiled region)
VARLEN_PARAMS = (
    frozenset(inspect.signature(_varlen_fn()).parameters) if _varlen_fn() is not None else frozenset()
)


def varlen_attention(q, k, v, cu, max_len: int, scale: float, window: int | None):
    """q (N, Hq, D), k/v (N, Hkv, D), cu (docs + 1,) int32: causal attention within each document."""
    kw = {"scale": scale}
    if "window_size" in VARLEN_PARAMS:
        kw["window_size"] = (window - 1 if window else -1, 0)  # (left, right): causal, W keys with itself
        if "is_causal" in VARLEN_PARAMS:
            kw["is_causal"] = False
    else:  # older signature: a causal flag and no window
        if window:
            raise NotImplementedError("this torch's varlen_attn has no sliding window")
        kw["is_causal"] = True
    if k.shape[1] != q.shape[1] and "enable_gqa" in VARLEN_PARAMS:
        kw["enable_gqa"] = True
    return _varlen_fn()(q, k, v, cu, cu, max_len, max_len, **kw)


def attend(q, k, v, scale: float, window: int | None, attn: str, meta):
    """q (B, T, Hq, D), k/v (B, T, Hkv, D) -> (B, T, Hq, D)."""
    B, T, Hq, D = q.shape
    if attn == "varlen":
        cu, max_len = meta
        o = varlen_attention(
            q.reshape(B * T, Hq, D),
            k.reshape(B * T, -1, D),
            v.reshape(B * T, -1, D),
            cu,
            max_len,
            scale,
            window,
        )
        return o.view(B, T, Hq, D)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = kt.shape[1] != Hq
    if attn == "flex":
        o = flex_attention(qt, kt, vt, meta, scale)
    elif attn == "sdpa_causal":
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=meta, scale=scale, enable_gqa=gqa)
    return o.transpose(1, 2)


def varlen_works(device: torch.device) -> bool:
    """A small GQA problem through varlen against SDPA, on ``device`` (False on any error or mismatch)."""
    if _varlen_fn() is None:
        return False
    try:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(96, 4, 64, device=device, dtype=torch.bfloat16, generator=g)
        k = torch.randn(96, 2, 64, device=device, dtype=torch.bfloat16, generator=g)
        v = torch.randn(96, 2, 64, device=device, dtype=torch.bfloat16, generator=g)
        cu = torch.tensor([0, 40, 96], dtype=torch.int32, device=device)
        out = varlen_attention(q, k, v, cu, 96, 0.125, None)
        ref = torch.cat(
            [
                F.scaled_dot_product_attention(
                    q[s:e].transpose(0, 1).float(),
                    k[s:e].transpose(0, 1).repeat_interleave(2, 0).float(),
                    v[s:e].transpose(0, 1).repeat_interleave(2, 0).float(),
                    is_causal=True,
                    scale=0.125,
                ).transpose(0, 1)
                for s, e in ((0, 40), (40, 96))
            ]
        )
        return bool(((out.float() - ref).norm() / ref.norm()) < 2e-2)
    except Exception:  # noqa: BLE001 - any failure means: do not use it
        return False


# -- document metadata --------------------------------------------------------------------------------------
def doc_starts(doc: torch.Tensor) -> torch.Tensor:
    start = torch.ones_like(doc, dtype=torch.bool)
    start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    return start


def varlen_meta(doc_ids: torch.Tensor, device) -> tuple[torch.Tensor, int]:
    """cu_seqlens over the flattened rows (each row's first token starts a document); max length T."""
    B, T = doc_ids.shape
    starts = torch.nonzero(doc_starts(doc_ids).flatten()).flatten()  # device sync when doc_ids is on the GPU
    cu = torch.cat([starts, starts.new_tensor([B * T])]).to(torch.int32)
    return cu.to(device, non_blocking=True), T


def flex_mask(doc: torch.Tensor, window: int | None, device):
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc.shape

    def mod(b, h, q, kv):
        m = (doc[b, q] == doc[b, kv]) & (q >= kv)
        if window is not None:
            m = m & (q - kv < window)
        return m

    return create_block_mask(mod, B=B, H=None, Q_LEN=T, KV_LEN=T, device=device, _compile=True)


def dense_mask(doc: torch.Tensor, window: int | None) -> torch.Tensor:
    T = doc.shape[1]
    q = torch.arange(T, device=doc.device).view(T, 1)
    kv = torch.arange(T, device=doc.device).view(1, T)
    m = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (q >= kv)
    if window is not None:
        m = m & (q - kv < window)
    return m.unsqueeze(1)
