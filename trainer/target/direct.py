"""The direct capture path: our own loop over a pre-norm decoder's layers, per-document attention, compiled.

Used by ``capture.capture`` once ``prepare_capture(model)`` has qualified the model (``capture.py`` documents
the API). Each layer step is the transformers decoder layer's computation written out for the pre-norm
Qwen3 / Qwen2 / Llama / Mistral family, on the layer's own modules (norms, projections, MLP):
``h + o_proj(attn(rope(q_norm(q_proj(n1(h)))), rope(k_norm(k_proj(n1(h)))), v_proj(n1(h))))`` then
``h + mlp(n2(h))``, with RoPE from the decoder's ``rotary_emb`` (all its scaling variants) at per-document
positions. Attention is causal within each document of a packed row and never crosses one; sliding layers
see ``W`` keys counting themselves (transformers' convention). Nothing here builds a ``(T, T)`` mask
except the ``"sdpa"`` mode (CPU / reference). The projections are module calls: an FP8 target's
``fp8.Fp8Linear`` layers (``loading.py``) run here as they are, inside the compiled step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from trainer.drafting.compiling import compile_enabled
from trainer.drafting.config import text_config_of
from trainer.drafting.masks import doc_positions
from trainer.drafting.rope import apply_rope
from trainer.target.attention import ATTN_MODES, attend, dense_mask, flex_mask, varlen_meta, varlen_works
from trainer.target.base import Capture, attach, check_layer_ids, decoder_of, store_layer

DIRECT_MODEL_TYPES = frozenset({"qwen3", "qwen2", "llama", "mistral"})


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
    o = attend(q, k, v, a.scaling, window, attn, meta)
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


def prepare_capture(model: nn.Module, attn: str = "auto", compile: bool | None = None) -> str | None:
    """Switch ``capture`` to the direct path (see capture.py); returns the attention mode or None."""
    if attn != "auto" and attn not in ATTN_MODES:
        raise ValueError(f"attn must be 'auto' or one of {ATTN_MODES}, got {attn!r}")
    if not _qualifies(model):
        attach(model, None)
        return None
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if attn == "auto":
        attn = "varlen" if cuda and varlen_works(device) else ("flex" if cuda else "sdpa")
    if attn == "sdpa_causal" and any(layer_window(model, i) for i in range(len(decoder_of(model).layers))):
        raise ValueError("attn='sdpa_causal' does not support sliding-window layers")
    if compile is None:
        compile = cuda and compile_enabled()
    step = torch.compile(layer_step, dynamic=None) if compile else layer_step
    attach(model, DirectCapture(attn=attn, compiled=bool(compile), step=step))
    return attn


# -- the capture ----------------------------------------------------------------------------------------------
def _attention_meta(attn: str, doc_ids, doc_dev, windows: list[int | None], rows: int, dev):
    """The attention mode this batch runs (varlen on rows of one document each: SDPA's causal kernel) and
    the metadata of each sliding window among ``windows`` (None: full attention)."""
    if attn == "varlen":
        cu, max_len = varlen_meta(doc_ids, dev)
        if cu.shape[0] - 1 == rows and not any(windows):
            attn = "sdpa_causal"  # one document per row: SDPA's causal kernel, ~10% faster here (H200)
        return attn, dict.fromkeys(windows, (cu, max_len))
    if attn == "flex":
        return attn, {w: flex_mask(doc_dev, w, dev) for w in set(windows)}
    if attn == "sdpa":
        return attn, {w: dense_mask(doc_dev, w) for w in set(windows)}
    return attn, dict.fromkeys(windows)


@dataclass(frozen=True, eq=False)
class DirectCapture(Capture):
    """Our loop over a pre-norm decoder's layers (module docstring), one ``step`` (compiled or not) per layer."""

    kind = "direct"
    attn: str
    compiled: bool
    step: Callable = field(repr=False)

    def __call__(self, model, input_ids, doc_ids, target_layer_ids, need_final_hidden):
        base = decoder_of(model)
        layers = base.layers
        check_layer_ids(target_layer_ids, len(layers))
        dev = input_ids.device
        step = self.step
        B, T = input_ids.shape
        last = len(layers) - 1 if need_final_hidden else max(target_layer_ids)
        windows = [layer_window(model, i) for i in range(last + 1)]
        with torch.no_grad():
            doc_dev = doc_ids.to(dev, non_blocking=True)
            attn, meta = _attention_meta(self.attn, doc_ids, doc_dev, windows, B, dev)
            h = base.embed_tokens(input_ids)
            cos, sin = base.rotary_emb(h, doc_positions(doc_dev))
            H = h.shape[-1]
            out = torch.empty(B, T, len(target_layer_ids) * H, dtype=h.dtype, device=dev)
            for i in range(last + 1):
                h = step(layers[i], h, cos, sin, attn, meta[windows[i]], windows[i])
                store_layer(out, h, i, target_layer_ids)
            final = base.norm(h) if need_final_hidden else None
        return out, final
