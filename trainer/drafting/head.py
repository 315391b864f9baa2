"""FrozenHead: the target's embed_tokens, final norm and lm_head, frozen, for the drafter's input and logits.

- ``FrozenHead(embed_tokens, norm, lm_head)``: all parameters ``requires_grad=False``. Tied embeddings:
  ``lm_head.weight`` is ``embed_tokens.weight`` (one tensor).
- ``FrozenHead.from_pretrained(target_path, dtype=None, device="cpu")`` reads ONLY these three tensors from
  the target's safetensors files (``model.safetensors.index.json`` or a single ``model.safetensors``) with
  ``safe_open``; the rest of the checkpoint is never loaded. Keys are found by suffix (``embed_tokens.weight``,
  ``<same prefix>norm.weight``, ``lm_head.weight``; ``mtp``/``visual`` keys skipped), so text models and
  multimodal wrappers (``model.language_model.*``) both work. Zero-centred norms (Qwen3-Next / Qwen3.5, which
  compute ``(1 + w) * x``) are stored as ``1 + w`` here.
  ``shared={"embed_tokens": t, "norm": t, "lm_head": t}`` (any subset): tensors already in memory (the target's
  own, loaded in this process on ``device`` in ``dtype``: runtime/shared_head.py) used as they are, sharing
  their storage, instead of reading them; the file is read only for the ones missing. A shared zero-centred
  norm weight becomes ``1 + w`` (a new tensor of ``hidden`` values: the only copy).
- ``FrozenHead.from_model(hf_model)`` shares the modules of a loaded transformers model (tests).
- ``forward(h)`` / ``logits(h)`` = ``lm_head(h)`` for hidden states that are already normed (the drafter's
  output, or the target's ``last_hidden_state``); ``logits(h, prenorm=True)`` applies ``norm`` first.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from torch import nn

from trainer.drafting.norm import RMSNorm

_ZERO_CENTRED_NORM = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


def _frozen_norm(weight: torch.Tensor, eps: float) -> RMSNorm:
    norm = RMSNorm(weight.shape[-1], eps)
    norm.weight = nn.Parameter(weight, requires_grad=False)
    return norm


class FrozenHead(nn.Module):
    def __init__(self, embed_tokens: nn.Module, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.norm = norm
        self.lm_head = lm_head
        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    @property
    def vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    def logits(self, h: torch.Tensor, prenorm: bool = False) -> torch.Tensor:
        return self.lm_head(self.norm(h) if prenorm else h)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.logits(h)

    def train(self, mode: bool = True) -> FrozenHead:  # always eval: nothing here trains
        return super().train(False)

    @classmethod
    def from_model(cls, hf_model: nn.Module) -> FrozenHead:
        base = getattr(hf_model, "model", hf_model)
        base = getattr(base, "language_model", base)
        return cls(hf_model.get_input_embeddings(), base.norm, hf_model.get_output_embeddings())

    @classmethod
    def from_pretrained(
        cls,
        target_path: str | os.PathLike,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        shared: dict[str, torch.Tensor] | None = None,
    ) -> FrozenHead:
        shared = {k: v.detach() for k, v in (shared or {}).items() if v is not None}

        target_path = os.fspath(target_path)
        with open(os.path.join(target_path, "config.json")) as f:
            top = json.load(f)
        text = top.get("text_config") or top
        eps = float(text.get("rms_norm_eps", top.get("rms_norm_eps", 1e-6)))
        model_type = text.get("model_type", top.get("model_type"))

        key_to_file = weight_map(target_path)
        embed_key = _pick(key_to_file, "embed_tokens.weight")
        if embed_key is None:
            raise ValueError(f"no embed_tokens.weight in the safetensors files of {target_path}")
        norm_key = embed_key[: -len("embed_tokens.weight")] + "norm.weight"
        if norm_key not in key_to_file:
            raise ValueError(f"no final norm {norm_key!r} next to {embed_key!r} in {target_path}")
        head_key = _pick(key_to_file, "lm_head.weight")

        def read(key: str, name: str) -> torch.Tensor:
            if name in shared:  # the target's own tensor: same storage, nothing read
                return shared[name]
            with safe_open(os.path.join(target_path, key_to_file[key]), framework="pt", device="cpu") as f:
                t = f.get_tensor(key)
            return t.to(device=device, dtype=dtype or t.dtype)

        embed_w = read(embed_key, "embed_tokens")
        norm_w = read(norm_key, "norm")
        if model_type in _ZERO_CENTRED_NORM:
            norm_w = (norm_w.float() + 1.0).to(norm_w.dtype)
        vocab, hidden = embed_w.shape
        embed = nn.Embedding(vocab, hidden, device="meta")
        embed.weight = nn.Parameter(embed_w, requires_grad=False)
        lm_head = nn.Linear(hidden, vocab, bias=False, device="meta")
        # tied when the checkpoint has no lm_head (tie_word_embeddings); else the stored one
        lm_head.weight = (
            embed.weight if head_key is None else nn.Parameter(read(head_key, "lm_head"), requires_grad=False)
        )
        return cls(embed, _frozen_norm(norm_w, eps), lm_head)


def weight_map(path: str) -> dict[str, str]:
    """Checkpoint key -> safetensors file name (the index, or the one ``model.safetensors``)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"no model.safetensors(.index.json) in {path}")
    with safe_open(single, framework="pt", device="cpu") as f:
        return {k: "model.safetensors" for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _pick(keys: dict[str, str], suffix: str) -> str | None:
    """The shortest key ending in ``suffix`` outside mtp/visual sub-models (the decoder's own)."""
    cands = [
        k
        for k in keys
        if (k == suffix or k.endswith("." + suffix)) and not any(s in k for s in ("mtp", "visual", "vision"))
    ]
    return min(cands, key=len) if cands else None
