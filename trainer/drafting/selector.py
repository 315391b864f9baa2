"""DFlash 2's candidate path selector: its weights, its training loss and the walk that proposes a block.

Layout (vLLM ``qwen3_dflash2.py`` ``CandidateSelector``; vllm-project/speculators ``CandidateSelector``):
``predecessor_codebook`` ``(vocab, rank)``, ``successor_codebook`` ``(vocab, rank)``, ``hidden_projection``
(``Linear(hidden, rank)``, no bias); checkpoint names ``candidate_selector.<name>``.

At every drafted slot ``l`` (block positions 1 .. block_size - 1) the candidates are the ``top_k`` tokens of
the drafter's own logits (``lm_head`` of its normed output ``h_l``). The score of the edge from predecessor
token ``p`` (slot ``l - 1``'s token; the verified anchor for ``l = 1``) to candidate ``c`` is

    unary_logit_l[c] + < predecessor_codebook[p] * hidden_projection(h_l), successor_codebook[c] >

(the low-rank bilinear term under the context gate ``hidden_projection(h_l)``).

- ``edge_scores``: ``(L, K, K)`` scores ``[l, i, j]`` of candidate ``j`` at slot ``l`` after candidate ``i`` at
  slot ``l - 1`` (for ``l = 0`` every row has the anchor as predecessor), as vLLM's ``_score_edges``.
- ``walk``: the serving walk (vLLM ``_selector_walk_kernel``): from the anchor, at each slot the candidate of
  the highest score given the token chosen before (ties: the lowest rank), or at temperature ``T > 0`` one
  drawn from ``softmax(score / T)`` over the ``K`` candidates; that distribution is returned for lossless
  verification (rejection sampling against the target).
- ``selector_loss``: how speculators trains it (``models/dflash2/metrics.py`` ``compute_metrics``: the label is
  ``targets.argmax(-1)``, the verifier's own next token; ``core.py`` ``_predecessor_ids``: the predecessor is
  the data token): the label is what a greedy verifier accepts, the target's argmax at the slot, when the
  trainer has the target's logits (soft labels: ``labels=`` the ``label_ids`` that ``dflash_loss(...,
  topk=K)`` takes from its own chunked pass), else the data token; teacher forcing on the data (the
  predecessor is the data token before, the anchor for slot 1); the candidate set is the unary top-k with the
  label put in place of the last candidate when it is missing; cross-entropy over the ``K`` candidates with
  the DFlash position weights, added to the DFlash loss with weight 1. By default the unary logits enter the
  selector's score detached (the unary term is trained by the DFlash loss); the gradient reaches the three
  selector tensors and the drafter through ``hidden_projection``. ``unary_grad=True`` (the trainer's
  ``--selector-unary-grad``) lets the selector's loss reach the drafter through the unary logits too, as
  speculators does (its score adds the live logits): the scores keep the values above, and the backward adds
  ``sum_k g[n, k] * lm_head[cand[n, k]]`` into the drafter's hidden state, gathered chunk by chunk
  (``_UnaryLogitsGrad``: no ``(N, K, hidden)`` tensor is kept, no second pass over the logits forward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.drafting.loss import position_weights


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__()
        if top_k > vocab_size:
            raise ValueError(f"selector_top_k ({top_k}) cannot exceed vocab_size ({vocab_size})")
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for p in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
            nn.init.normal_(p, std=std)

    def transition(
        self, hidden: torch.Tensor, prev_ids: torch.Tensor, cand_ids: torch.Tensor
    ) -> torch.Tensor:
        """``hidden`` ``(N, H)``, ``prev_ids`` ``(N,)`` or ``(N, P)``, ``cand_ids`` ``(N, K)`` -> the bilinear
        term ``(N, K)`` or ``(N, P, K)``."""
        gate = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))  # (N, R)
        pred = self.predecessor_codebook[prev_ids.long()]
        ctx = pred * (gate if prev_ids.dim() == 1 else gate.unsqueeze(1))
        succ = self.successor_codebook[cand_ids.long()]  # (N, K, R)
        if prev_ids.dim() == 1:
            return torch.einsum("nr,nkr->nk", ctx, succ)
        return torch.einsum("npr,nkr->npk", ctx, succ)

    @torch.no_grad()
    def edge_scores(
        self, hidden: torch.Tensor, cand_ids: torch.Tensor, unary: torch.Tensor, anchor_id: int
    ) -> torch.Tensor:
        """One block: ``hidden`` ``(L, H)`` (the drafted slots), ``cand_ids``/``unary`` ``(L, K)`` -> ``(L, K, K)``."""
        L, K = cand_ids.shape
        first = torch.full((1, K), int(anchor_id), dtype=torch.long, device=cand_ids.device)
        prev = torch.cat([first, cand_ids[:-1].long()], dim=0)  # (L, K): predecessor candidates
        return unary.float().unsqueeze(1) + self.transition(hidden, prev, cand_ids).float()


def walk(
    edges: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``edges`` ``(L, K, K)`` (or ``(R, L, K, K)``: ``R`` blocks at once) -> (the candidate index per slot
    ``(L,)``, the distribution over the ``K`` candidates each was drawn from ``(L, K)``, or None at
    temperature 0). Greedy: the first maximum (the lowest rank on ties), as serving's walk."""
    single = edges.dim() == 3
    e = edges.unsqueeze(0) if single else edges
    R, L, K, _ = e.shape
    rows = torch.arange(R, device=e.device)
    prev = torch.zeros(R, dtype=torch.long, device=e.device)  # slot 0's rows are all the anchor's
    picks, dists = [], []
    for step in range(L):
        s = e[rows, step, prev].float()  # (R, K): the scores after the token chosen before
        if temperature <= 0:
            prev = s.argmax(dim=-1)
        else:
            q = torch.softmax(s / temperature, dim=-1)
            prev = torch.multinomial(q, 1, generator=generator).view(R)
            dists.append(q)
        picks.append(prev)
    idx = torch.stack(picks, dim=1)
    q = torch.stack(dists, dim=1) if dists else None
    if single:
        return idx[0], (None if q is None else q[0])
    return idx, q


class _UnaryLogitsGrad(torch.autograd.Function):
    """``h`` ``(N, H)``, ``weight`` ``(V, H)`` (frozen), ``cand`` ``(N, K)`` -> zeros ``(N, K)`` fp32 whose
    gradient in ``h`` is that of the logits ``h[n] . weight[cand[n, k]]``: added to those logits' values (already
    taken, detached), it makes them live without computing them again. The backward gathers ``chunk`` rows at
    a time, so the ``(N, K, H)`` rows are never all held."""

    @staticmethod
    def forward(ctx, h, weight, cand, chunk):
        ctx.save_for_backward(weight, cand)
        ctx.chunk, ctx.h_dtype = chunk, h.dtype
        return torch.zeros(cand.shape, dtype=torch.float32, device=h.device)

    @staticmethod
    def backward(ctx, grad):
        weight, cand = ctx.saved_tensors
        gh = torch.empty(cand.shape[0], weight.shape[1], dtype=ctx.h_dtype, device=grad.device)
        for s in range(0, cand.shape[0], ctx.chunk):
            rows = weight[cand[s : s + ctx.chunk]]  # (n, K, H)
            g = grad[s : s + ctx.chunk].to(weight.dtype)
            gh[s : s + ctx.chunk] = torch.einsum("nk,nkh->nh", g, rows).to(ctx.h_dtype)
        return gh, None, None, None


@torch.no_grad()
def _unary_topk(
    h: torch.Tensor, weight: torch.Tensor, k: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    ids, vals = [], []
    for s in range(0, h.shape[0], chunk):
        logits = h[s : s + chunk].to(weight.dtype) @ weight.t()
        # top-k in the logits' own dtype (bf16 on CUDA): the same values as in fp32 (bf16 -> fp32 is exact),
        # without an fp32 copy of a (chunk, vocab) tensor
        v, i = logits.topk(k, dim=-1)
        ids.append(i)
        vals.append(v.float())
    return torch.cat(ids), torch.cat(vals)


def selector_loss(
    draft_hidden: torch.Tensor,
    selector: CandidateSelector,
    lm_head_weight: torch.Tensor,
    input_ids: torch.Tensor,
    anchors: torch.Tensor,
    gamma: float,
    chunk_tokens: int = 4096,
    candidates: tuple[torch.Tensor, torch.Tensor] | None = None,
    labels: torch.Tensor | None = None,
    n_train: int | None = None,
    unary_grad: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The selector's teacher-forced K-way cross-entropy over the slots ``k >= 1`` of real blocks, weighted as
    ``dflash_loss`` (``exp(-(k-1)/gamma)``), normalised by the weights' sum (0 with no real block).
    Metrics, both against the label: ``selector_recall`` (the label among the unary top-k), ``selector_acc``
    (the teacher-forced best candidate is the label).
    ``candidates``: the unary top-k ``(ids, fp32 values)`` already taken by ``dflash_loss(..., topk=top_k)``
    from the same logits (the trainer's way: no second ``lm_head`` pass); None: computed here.
    ``labels``: ``(B * A * (block_size - 1),)`` the label of every scored slot, block-major (the trainer
    passes ``dflash_loss``'s ``label_ids``: the target's argmax with soft labels); None: the data token.
    The predecessor is the data token before either way (speculators' teacher forcing).
    ``n_train``: the first ``n_train`` anchor columns are training blocks; the rest (the trainer's measuring
    blocks, ``dflash_loss``'s ``n_train``) get weight 0 and stay out of the metrics. None: all of them train.
    ``unary_grad``: the loss also reaches ``draft_hidden`` through the candidates' unary logits (speculators'
    objective); the loss's value is the same either way."""
    B, A, bs, H = draft_hidden.shape
    T = input_ids.shape[1]
    device = draft_hidden.device
    anchors = anchors.long()
    valid = anchors >= 0
    if n_train is not None:
        if not 0 <= n_train <= A:
            raise ValueError(f"n_train must be in 0 .. A = {A}, got {n_train}")
        valid[:, n_train:] = False  # measuring blocks: no loss, no gradient, not in the metrics
    k = torch.arange(1, bs, device=device)
    tpos = anchors.unsqueeze(-1) + k
    slot_ok = valid.unsqueeze(-1) & (tpos < T)
    tpos_c = tpos.clamp(0, T - 1)
    if labels is None:
        labels = torch.gather(input_ids, 1, tpos_c.view(B, -1)).view(-1)
    elif labels.shape != (B * A * (bs - 1),):
        raise ValueError(f"labels {tuple(labels.shape)} must be ({B * A * (bs - 1)},): one per scored slot")
    else:
        labels = labels.to(device=device, dtype=torch.long)
    prev = torch.gather(input_ids, 1, (tpos_c - 1).clamp(min=0).view(B, -1)).view(-1)
    w = (position_weights(bs, gamma, device)[1:].expand(B, A, bs - 1) * slot_ok).reshape(-1)
    h = draft_hidden[:, :, 1:, :].reshape(-1, H)

    if candidates is None:
        cand, unary = _unary_topk(h.detach(), lm_head_weight, selector.top_k, chunk_tokens)
    else:
        cand, unary = candidates
        if cand.shape != (h.shape[0], selector.top_k):
            raise ValueError(f"candidates {tuple(cand.shape)} must be ({h.shape[0]}, {selector.top_k})")
        cand, unary = cand.clone(), unary.clone()  # the label goes in place of the last candidate below
    hit = cand.eq(labels.unsqueeze(1))
    present = hit.any(dim=1)
    with torch.no_grad():  # the label's own logit where it takes the last candidate's place
        label_logit = (h.detach().to(lm_head_weight.dtype) * lm_head_weight[labels]).sum(-1).float()
    cand[:, -1] = torch.where(present, cand[:, -1], labels)
    unary[:, -1] = torch.where(present, unary[:, -1], label_logit)
    tgt = torch.where(present, hit.long().argmax(dim=1), torch.full_like(labels, selector.top_k - 1))
    if unary_grad:  # the values above, plus a zero that carries the gradient of the live logits
        unary = unary + _UnaryLogitsGrad.apply(
            h, lm_head_weight, cand, max(1, chunk_tokens // selector.top_k)
        )
    scores = unary + selector.transition(h, prev, cand).float()
    ce = F.cross_entropy(scores, tgt, reduction="none")
    loss = (ce * w).sum() / w.sum().clamp(min=1e-12)
    with torch.no_grad():
        real = w > 0
        n = real.sum().clamp(min=1).float()
        metrics = {
            "selector_recall": (present & real).sum().float() / n,
            "selector_acc": ((scores.argmax(dim=1) == tgt) & present & real).sum().float() / n,
        }
    return loss, metrics
