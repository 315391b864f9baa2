"""What every capture path is: ``Capture``, the one dispatch of ``capture.capture``, and what the paths share.

A ``Capture`` is chosen once for a loaded target (``load_target``, ``direct.prepare_capture``,
``hybrid.prepare_hybrid``) and held by the model (``attach``; ``capture.capture_of`` reads it): ``HookCapture``
(transformers' forward with hooks; the model holds None), ``DirectCapture`` (our loop over a pre-norm decoder)
or ``HybridCapture`` (our per-document loop over a Qwen3.5 / 3.6 decoder). It holds the settings and the
compiled steps, never the model, which every call is given (so dropping the model frees it at once).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import fields
from typing import ClassVar

import torch
from torch import nn

ATTR = "_dflash_capture"  # where a model holds its Capture (None: the hook path)


class Capture(ABC):
    """One way of capturing a target's hidden states at the capture layers (see capture.py).

    Subclasses are dataclasses of their settings: ``attn`` (the attention mode, None for hooks), ``compiled``
    (whether the first call compiles), and their own."""

    kind: ClassVar[str]
    attn: str | None
    compiled: bool

    @abstractmethod
    def __call__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor,
        target_layer_ids: list[int],
        need_final_hidden: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(hidden_cat (B, T, n*H), final_hidden (B, T, H) or None), as ``capture.capture`` documents."""

    def record(self) -> dict:
        """The settings as a plain dict (``kind`` first; no compiled functions): for logs and bench records."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self) if f.repr}}


def attach(model: nn.Module, cap: Capture | None) -> None:
    """Make ``cap`` the model's capture path (None: the hook path)."""
    setattr(model, ATTR, cap)


def decoder_of(model: nn.Module) -> nn.Module:
    """The base decoder (``model.model``; its ``language_model`` for multimodal wrappers)."""
    base = getattr(model, "model", model)
    return getattr(base, "language_model", base)


def check_layer_ids(target_layer_ids: list[int], n_layers: int) -> None:
    if any(not 0 <= i < n_layers for i in target_layer_ids):
        raise ValueError(f"target_layer_ids {target_layer_ids} out of range for {n_layers} loaded layers")


def store_layer(out: torch.Tensor, h: torch.Tensor, i: int, target_layer_ids: list[int]) -> None:
    """Write layer ``i``'s output ``h`` into every slot of ``out`` (..., n*H) that captures layer ``i``."""
    H = h.shape[-1]
    for slot, li in enumerate(target_layer_ids):
        if li == i:
            out[..., slot * H : (slot + 1) * H] = h
