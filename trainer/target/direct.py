"""The direct capture path: our own loop over a pre-norm decoder's layers, per-document attention, compiled.

Used by ``capture.capture`` once ``prepare_capture(model)`` has qualified the model (``capture.py`` documents
the API). Each layer step is the transformers decoder layer's computation written out for the pre-norm
Qwen3 / Qwen2 / Llama / Mistral family, on the layer's own modules (norms, projections, MLP):
``h + o_proj(attn(rope(q_norm(q_proj(n1(h)))), rope(k_norm(k_proj(n1(h)))), v_proj(n1(h))))`` then
``h + mlp(n2(h))``, with RoPE from the decoder's ``rotary_emb`` (all its scaling variants) at per-document
positions. Attention is causal within each document of a packed row and never crosses one; sliding layers
see ``W`` keys counting themselves (transformers' convention). Nothing here builds a ``(T, T)`` mask
except the ``"sdpa"`` mode (CPU / reference).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from trainer.drafting.compiling import compile_enabled
from trainer.drafting.config import text_config_of
from trainer.drafting.flex import flex_attention
from trainer.drafting.masks import doc_positions
from trainer.drafting.rope import apply_rope

DIRECT_MODEL_TYPES = frozenset({"qwen3", "qwen2", "llama", "mistral"})
ATTN_MODES = ("varlen", "flex", "sdpa", "sdpa_causal")


def decoder_of(model: nn.Module) -> nn.Module:
    """The base decoder (``model.model``; its ``language_model`` for multimodal wrappers)."""
    base = getattr(model, "model", model)
    return getattr(base, "language_model", base)


# -- attention kernels ---------------------------------------------------------------------------------
def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


# the keyword arguments this torch's varlen_attn takes (read once, outside any compiled region)
_VARLEN_PARAMS = (
    frozenset(inspect.signature(_varlen_fn()).parameters) if _varlen_fn() is not None else frozenset()
)


def _varlen(q, k, v, cu, max_len: int, scale: float, window: int | None):
    """q (N, Hq, D), k/v (N, Hkv, D), cu (docs + 1,) int32: causal attention within each document."""
    kw = {"scale": scale}
    if "window_size" in _VARLEN_PARAMS:
        kw["window_size"] = (window - 1 if window else -1, 0)  # (left, right): causal, W keys with itself
        if "is_causal" in _VARLEN_PARAMS:
            kw["is_causal"] = False
    else:  # older signature: a causal flag and no window
        if window:
            raise NotImplementedError("this torch's varlen_attn has no sliding window")
        kw["is_causal"] = True
    if k.shape[1] != q.shape[1] and "enable_gqa" in _VARLEN_PARAMS:
        kw["enable_gqa"] = True
    return _varlen_fn()(q, k, v, cu, cu, max_len, max_len, **kw)


def _attend(q, k, v, scale: float, window: int | None, attn: str, meta):
    """q (B, T, Hq, D), k/v (B, T, Hkv, D) -> (B, T, Hq, D)."""
    B, T, Hq, D = q.shape
    if attn == "varlen":
        cu, max_len = meta
        o = _varlen(
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


def layer_step(layer: nn.Module, h, cos, sin, attn: str, meta, window: int | None):
    """One pre-norm decoder layer on ``h`` (B, T, H); cos/sin (B, T, D) from the decoder's rotary_emb."""
    B, T, _ = h.shape
    a = layer.self_attn
    hd = a.head_dim
    x = layer.input_layernorm(h)
    q = a.q_proj(x).view(B, T, -1, hd)
    k = a.k_proj(x).view(B, T, -1, hd)
    v = a.v_proj(x).view(B, T, -1, hd)
    if getattr(a, "q_norm", None) is not None:
        q = a.q_norm(q)
        k = a.k_norm(k)
    q = apply_rope(q, cos, sin, unsqueeze_dim=2).to(v.dtype)
    k = apply_rope(k, cos, sin, unsqueeze_dim=2).to(v.dtype)
    o = _attend(q, k, v, a.scaling, window, attn, meta)
    h = h + a.o_proj(o.reshape(B, T, -1))
    m = layer.mlp(layer.post_attention_layernorm(h))
    if isinstance(m, tuple):  # MoE blocks that also return router logits
        m = m[0]
    return h + m


def layer_window(model: nn.Module, i: int) -> int | None:
    """Layer ``i``'s sliding window as transformers' masks apply it: per ``layer_types`` where the config
    has them (Qwen2 / Qwen3), else the config's ``sliding_window`` on every layer (Mistral); None = full."""
    tc = text_config_of(model.config)
    w = getattr(tc, "sliding_window", None)
    types = getattr(tc, "layer_types", None)
    if isinstance(types, (list, tuple)) and types:
        return w if types[i] == "sliding_attention" else None
    return w


# -- preparation -----------------------------------------------------------------------------------------
def _qualifies(model: nn.Module) -> bool:
    tc = text_config_of(model.config) if hasattr(model, "config") else None
    if tc is None or getattr(tc, "model_type", None) not in DIRECT_MODEL_TYPES:
        return False
    base = decoder_of(model)
    if not all(hasattr(base, n) for n in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    types = getattr(tc, "layer_types", None) or []
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        return False
    for layer in base.layers:
        a = getattr(layer, "self_attn", None)
        if a is None or not all(
            hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
        ):
            return False
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return False
    return True


def _varlen_works(device: torch.device) -> bool:
    """A small GQA problem through varlen against SDPA, on ``device`` (False on any error or mismatch)."""
    if _varlen_fn() is None:
        return False
    try:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(96, 4, 64, device=device, dtype=torch.bfloat16, generator=g)
        k = torch.randn(96, 2, 64, device=device, dtype=torch.bfloat16, generator=g)
        v = torch.randn(96, 2, 64, device=device, dtype=torch.bfloat16, generator=g)
        cu = torch.tensor([0, 40, 96], dtype=torch.int32, device=device)
        out = _varlen(q, k, v, cu, 96, 0.125, None)
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


def prepare_capture(model: nn.Module, attn: str = "auto", compile: bool | None = None) -> str | None:
    """Switch ``capture`` to the direct path (see capture.py); returns the attention mode or None."""
    if attn != "auto" and attn not in ATTN_MODES:
        raise ValueError(f"attn must be 'auto' or one of {ATTN_MODES}, got {attn!r}")
    if not _qualifies(model):
        model._dflash_capture = None
        return None
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if attn == "auto":
        attn = "varlen" if cuda and _varlen_works(device) else ("flex" if cuda else "sdpa")
    if attn == "sdpa_causal" and any(layer_window(model, i) for i in range(len(decoder_of(model).layers))):
        raise ValueError("attn='sdpa_causal' does not support sliding-window layers")
    if compile is None:
        compile = cuda and compile_enabled()
    step = torch.compile(layer_step, dynamic=None) if compile else layer_step
    model._dflash_capture = {"attn": attn, "step": step, "compiled": bool(compile)}
    return attn


# -- the capture ----------------------------------------------------------------------------------------------
def _doc_starts(doc: torch.Tensor) -> torch.Tensor:
    start = torch.ones_like(doc, dtype=torch.bool)
    start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    return start


def _varlen_meta(doc_ids: torch.Tensor, device) -> tuple[torch.Tensor, int]:
    """cu_seqlens over the flattened rows (each row's first token starts a document); max length T."""
    B, T = doc_ids.shape
    starts = torch.nonzero(_doc_starts(doc_ids).flatten()).flatten()  # device sync when doc_ids is on the GPU
    cu = torch.cat([starts, starts.new_tensor([B * T])]).to(torch.int32)
    return cu.to(device, non_blocking=True), T


def _flex_mask(doc: torch.Tensor, window: int | None, device):
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc.shape

    def mod(b, h, q, kv):
        m = (doc[b, q] == doc[b, kv]) & (q >= kv)
        if window is not None:
            m = m & (q - kv < window)
        return m

    return create_block_mask(mod, B=B, H=None, Q_LEN=T, KV_LEN=T, device=device, _compile=True)


def _dense_mask(doc: torch.Tensor, window: int | None) -> torch.Tensor:
    T = doc.shape[1]
    q = torch.arange(T, device=doc.device).view(T, 1)
    kv = torch.arange(T, device=doc.device).view(1, T)
    m = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (q >= kv)
    if window is not None:
        m = m & (q - kv < window)
    return m.unsqueeze(1)


def capture_direct(model, base, input_ids, doc_ids, target_layer_ids, need_final_hidden):
    st = model._dflash_capture
    layers = base.layers
    if any(not 0 <= i < len(layers) for i in target_layer_ids):
        raise ValueError(f"target_layer_ids {target_layer_ids} out of range for {len(layers)} loaded layers")
    dev = input_ids.device
    attn, step = st["attn"], st["step"]
    B, T = input_ids.shape
    last = len(layers) - 1 if need_final_hidden else max(target_layer_ids)
    windows = [layer_window(model, i) for i in range(last + 1)]
    with torch.no_grad():
        doc_dev = doc_ids.to(dev, non_blocking=True)
        if attn == "varlen":
            cu, max_len = _varlen_meta(doc_ids, dev)
            if cu.shape[0] - 1 == B and not any(windows):
                attn = "sdpa_causal"  # one document per row: SDPA's causal kernel, ~10% faster here (H200)
            meta = dict.fromkeys(windows, (cu, max_len))
        elif attn == "flex":
            meta = {w: _flex_mask(doc_dev, w, dev) for w in set(windows)}
        elif attn == "sdpa":
            meta = {w: _dense_mask(doc_dev, w) for w in set(windows)}
        else:
            meta = dict.fromkeys(windows)
        h = base.embed_tokens(input_ids)
        cos, sin = base.rotary_emb(h, doc_positions(doc_dev))
        H = h.shape[-1]
        out = torch.empty(B, T, len(target_layer_ids) * H, dtype=h.dtype, device=dev)
        for i in range(last + 1):
            h = step(layers[i], h, cos, sin, attn, meta[windows[i]], windows[i])
            for slot, li in enumerate(target_layer_ids):
                if li == i:
                    out[..., slot * H : (slot + 1) * H] = h
        final = base.norm(h) if need_final_hidden else None
    return out, final
