"""The context-back drafter: ``ContextBackDrafter(cfg, back)``, a ``trainer.model.DFlashDrafter`` whose ``fc``
reads each context position's captured features beside those of the ``back`` positions before it in the same
document (zeros before the document's first position), so one context key/value of the drafter also says which
tokens came just before its own.

Why (issue 35, bench/README.md "context-back"): from its second layer on, a dense target's hidden state at a
position also holds the two tokens before it (a linear probe reads them at 0.96-0.99); no layer of a hybrid Gated
DeltaNet target's does (at most 0.88). DFlash 1 sees the context only through these per-position states, so this
asked whether that is why it trails on the hybrid target. No server computes it (vLLM, SGLang and z-lab feed
``fc`` one position's features), which is why it lives here and not in the trainer.

- ``expand(h, doc_ids, back)``: packed rows ``(B, T, F)`` -> ``(B, T, (1 + back) F)``, position t's features
  ``[h_t, h_{t-1}, .., h_{t-back}]``.
- ``ContextBackDrafter``: the product's drafter with a wider ``fc`` (``ContextBackFC``, an ``nn.Linear`` of
  ``(1 + back) n H`` inputs that expands what it is given); its ``forward`` takes the same arguments as the
  product's and hands ``fc`` the batch's ``doc_ids``. Training's forward only: the trainer's decoding engines,
  export and checks do not know it (they did while it was the trainer's ``--context-back``, up to commit
  56109e7).
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.drafting.config import DraftConfig
from trainer.model import DFlashDrafter

MAX_BACK = 8


def expand(h: torch.Tensor, doc_ids: torch.Tensor, back: int) -> torch.Tensor:
    """``[h_t, h_{t-1}, .., h_{t-back}]`` along the last dim; a position before the row or in another document
    gives zeros."""
    if back == 0:
        return h
    parts = [h]
    for k in range(1, back + 1):
        prev = torch.zeros_like(h)
        prev[:, k:] = h[:, :-k]
        same = torch.zeros_like(doc_ids, dtype=torch.bool)
        same[:, k:] = doc_ids[:, k:] == doc_ids[:, :-k]
        parts.append(prev * same.unsqueeze(-1).to(h.dtype))
    return torch.cat(parts, dim=-1)


class ContextBackFC(nn.Linear):
    """``fc`` over ``expand(h, doc_ids, back)``: ``(B, T, F) -> (B, T, H)`` with a ``(H, (1 + back) F)`` weight.
    ``doc_ids`` is set by ``ContextBackDrafter.forward`` for the call (the product's forward calls ``fc`` with the
    features alone)."""

    def __init__(self, features: int, hidden: int, back: int):
        super().__init__(features * (1 + back), hidden, bias=False)
        self.back = back
        self.doc_ids: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.doc_ids is None:
            raise RuntimeError("ContextBackFC called outside ContextBackDrafter.forward (no doc_ids)")
        return super().forward(expand(h, self.doc_ids, self.back))


class ContextBackDrafter(DFlashDrafter):
    def __init__(self, cfg: DraftConfig, back: int):
        if not isinstance(back, int) or isinstance(back, bool) or not 1 <= back <= MAX_BACK:
            raise ValueError(f"back must be an integer 1..{MAX_BACK}, got {back!r}")
        super().__init__(cfg)
        self.back = back
        self.fc = ContextBackFC(cfg.num_captured * cfg.hidden_size, cfg.hidden_size, back)
        nn.init.normal_(self.fc.weight, std=0.02)  # the product's init (DFlashDrafter.reset_parameters)

    def forward(self, target_hidden, input_ids, doc_ids, anchors, embed_tokens, attn_impl: str = "sdpa"):
        self.fc.doc_ids = doc_ids
        try:
            return super().forward(target_hidden, input_ids, doc_ids, anchors, embed_tokens, attn_impl)
        finally:
            self.fc.doc_ids = None
