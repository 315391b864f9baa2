"""The context-back experiment (``DraftConfig.context_back``, the trainer's ``--context-back N``): ``fc`` reads
each context position's captured features beside those of the N positions before it in the same document (zeros
before the document's first position), so one context key/value of the drafter also says which tokens came just
before its own.

Why (issue 35, bench/README.md): from its second layer on, a dense target's hidden state at a position also holds
the two tokens before it (a linear probe reads them at 0.96-0.99); no layer of a hybrid Gated DeltaNet target's
does (at most 0.88). DFlash 1 sees the context only through these per-position states, so this asks whether that
is why it trails on the hybrid target. No server computes it (they feed ``fc`` one position's features), so
``trainer.export --check`` fails such a drafter for every server; ``trainer.evaluate`` serves it.

- ``expand(h, doc_ids, back)``: packed training rows ``(B, T, F)`` -> ``(B, T, (1 + back) F)``, position t's
  features ``[h_t, h_{t-1}, .., h_{t-back}]``.
- ``Tail(back)``: the same for decoding, one sequence whose features arrive a few positions at a time:
  ``push(new (n, F)) -> (n, (1 + back) F)``; a new ``Tail`` (or ``reset()``) for the next sequence.
"""

from __future__ import annotations

import torch


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


class Tail:
    """``expand`` for one sequence fed in order: keeps the last ``back`` positions' features."""

    def __init__(self, back: int):
        self.back = int(back)
        self.prev: torch.Tensor | None = None

    def reset(self) -> None:
        self.prev = None

    def push(self, new: torch.Tensor) -> torch.Tensor:
        if self.back == 0:
            return new
        n, b = new.shape[0], self.back
        prev = self.prev if self.prev is not None else new.new_zeros((b, new.shape[1]))
        seq = torch.cat([prev, new])
        self.prev = seq[-b:]
        return torch.cat([seq[b - k : b - k + n] for k in range(b + 1)], dim=-1)
