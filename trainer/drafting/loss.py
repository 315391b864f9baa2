"""DFlash loss: position-weighted cross-entropy over the vocabulary, computed in chunks.

``dflash_loss(draft_hidden (B,A,bs,H), head, input_ids (B,T), anchors (B,A), gamma,
target_final_hidden=None, chunk_tokens=4096, topk=0, n_train=None, objective=None) -> (loss, metrics)``

- ``n_train``: the first ``n_train`` anchor columns are the training blocks; the columns after them are
  *measuring* blocks (the trainer's ``--est-anchors``: one run of consecutive anchors per row, sorted, ``-1``
  padding). Measuring blocks get loss weight 0 (no loss, no gradient), stay out of ``acc``, ``accept_len``,
  ``n_blocks`` and ``chain_sum``, and are the only blocks ``decode_walk`` reads (``walk_tokens`` /
  ``walk_steps``). None (or ``A``): no measuring blocks, the walk runs over the training blocks.

- Slot ``k >= 1`` of block ``j`` predicts ``input_ids[anchors[j] + k]`` (slot 0 holds the given anchor
  token and is not scored). Weight ``w_k = exp(-(k - 1) / gamma)``; ``loss = sum w * CE / sum w`` over the
  slots of real blocks (``anchor >= 0``); no real block -> loss 0 (not NaN). ``gamma`` must be > 0
  (``float('inf')`` = uniform weights).
- Logits are ``head.lm_head(draft_hidden)`` (the drafter's output is already normed). They are computed
  ``chunk_tokens`` rows at a time by a custom autograd function that also computes the gradient w.r.t. the
  hidden states chunk by chunk in the forward, so neither pass ever holds a ``(N, V)`` tensor for all
  slots; backward is a scale of the stored ``(N, H)`` gradient.
- ``objective`` (``OBJECTIVES``; default ``data`` without ``target_final_hidden``, ``kl`` with it): ``data``:
  CE against the data token; the others need ``target_final_hidden`` (the target's ``last_hidden_state``,
  already through its final norm, ``(B,T,H)``): slot k's target distribution p is
  ``softmax(lm_head(target_final_hidden[a + k - 1]))`` (the target's next-token distribution at the position
  before), also chunkwise; ``target-argmax``: CE against p's argmax; ``kl`` / ``reverse-kl`` / ``jsd`` /
  ``tv``: that divergence between p and the drafter's q, as speculators 0.9.0 defines it (``_divergence``;
  ``kl`` is the old soft-label CE ``-sum p log q`` less the target's entropy: the same gradient). The
  weighted sum replaces CE in ``loss``.
- Metrics (tensors; no host sync here): ``acc`` ``(bs-1,)`` per position k=1..bs-1 (argmax == input_ids
  token; for real blocks), ``accept_len`` = ``sum_k prod_{i<=k} acc_i`` (the old estimate: it treats
  positions as independent and leaves out the bonus token), ``n_blocks`` (real blocks), ``chain_sum``: the sum
  over real blocks of the consecutive positions after the anchor that a greedy verifier would accept (its
  choice at a slot is the target's own argmax there when ``target_final_hidden`` gives the target's logits
  (the same chunked pass), else the data token); ``1 + chain_sum / n_blocks`` is the mean over uniformly sampled
  anchors (``accept_len_est_uniform``: reads high, easy stretches hold many anchors); ``walk_tokens`` and
  ``walk_steps``: the same chains walked as decoding would (``drafting.acceptance.decode_walk``), whose
  ratio is the estimate ``accept_len_est``.
  ``topk=K > 0`` (DFlash 2's selector, ``drafting.selector.selector_loss``): also ``topk_ids`` / ``topk_values``
  ``(N, K)`` (long / fp32), the top ``K`` logits of every scored slot (``N = B * A * (bs - 1)``, block-major),
  taken from the logits the loss computes anyway (no second ``lm_head`` pass), and ``label_ids`` ``(N,)``
  (long), the selector's label at every scored slot: the target's own argmax there when soft labels give the
  target's logits (the tokens the acceptance chains are judged by, from the same chunked pass), else the data
  token; not metrics: pop them.
  ``metrics_to_floats(metrics)`` turns them into ``{"acc": list[float], "accept_len": float,
  "n_blocks": int, "accept_len_est": float, "accept_len_est_uniform": float}`` with one device sync.
"""

from __future__ import annotations

import math

import torch

from trainer.drafting.acceptance import decode_walk
from trainer.drafting.compiling import compile_enabled
from trainer.drafting.head import FrozenHead

# The objectives ``dflash_loss`` trains with (docs/trainer.md "Labels and divergences"): CE against the data
# token or the target's argmax, or a divergence between the target's distribution p and the drafter's q, each
# as speculators 0.9.0 defines it (speculators/losses/eager.py): kl = KL(p || q), reverse-kl = KL(q || p),
# jsd = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2, tv = 1 - sum min(p, q).
HARD_OBJECTIVES = ("data", "target-argmax")
DIVERGENCES = ("kl", "reverse-kl", "jsd", "tv")
OBJECTIVES = HARD_OBJECTIVES + DIVERGENCES


def _through_softmax(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d/dlogits of a function of q = softmax(logits) whose gradient w.r.t. q is ``g``: q (g - <q, g>)."""
    return q * (g - (q * g).sum(-1, keepdim=True))


def _divergence(lf, lse, q, sf, objective):
    """(value per row, its gradient w.r.t. the drafter's logits) of one divergence (``DIVERGENCES``) between the
    target's p = softmax(sf) and the drafter's q = softmax(lf) (``lse``: lf's logsumexp, keepdim). No more
    (rows, V) temporaries than the objective needs: at the 27B vocabulary a 4,096-row chunk's is 4 GB in fp32."""
    lse_p = torch.logsumexp(sf, dim=-1, keepdim=True)
    p = torch.exp(sf - lse_p)
    if objective == "kl":  # sum p (log p - log q) = sum p (sf - lf) + lse - lse_p
        return (p * (sf - lf)).sum(-1) + (lse - lse_p).squeeze(1), q - p
    logq, logp = lf - lse, sf - lse_p
    if objective == "reverse-kl":
        d = logq - logp
        value = (q * d).sum(-1)
        return value, q * (d - value.unsqueeze(1))
    if objective == "jsd":
        logm = torch.logaddexp(logq, logp) - math.log(2.0)
        value = 0.5 * ((p * (logp - logm)).sum(-1) + (q * (logq - logm)).sum(-1))
        return value, _through_softmax(q, 0.5 * (logq - logm))  # the terms through m cancel
    # tv: 1 - sum min(p, q); d/dq_v = -1 where q_v < p_v (a constant shift of g cancels through the softmax)
    return 1.0 - torch.minimum(p, q).sum(-1), _through_softmax(q, -(q < p).to(q.dtype))


def _ce_chunk(logits, labels, w, soft_logits, objective="data"):
    """One chunk: (sum_i w_i loss_i, argmax, the judge (the target's argmax when its logits are given, else the
    data labels), dloss/dlogits * w in the logits' dtype), for one of ``OBJECTIVES``. In fp32 (fp64 inputs stay
    fp64). Compiled on CUDA (one fused pass over the chunk's logits instead of a dozen fp32 ones); the same
    function eagerly elsewhere."""
    lf = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(lf, dim=-1, keepdim=True)
    q = torch.exp(lf - lse)
    pred = lf.argmax(-1)
    sf = None if soft_logits is None else soft_logits.to(lf.dtype)
    judge = labels if sf is None else sf.argmax(-1)
    if objective in HARD_OBJECTIVES:
        label = labels if objective == "data" else judge
        value = lse.squeeze(1) - lf.gather(1, label.unsqueeze(1)).squeeze(1)
        onehot = torch.arange(lf.shape[1], device=lf.device).unsqueeze(0) == label.unsqueeze(1)
        g = q - onehot.to(lf.dtype)
    else:
        value, g = _divergence(lf, lse, q, sf, objective)
    wf = w.to(lf.dtype)
    return (value * wf).sum(), pred, judge, (g * wf.unsqueeze(1)).to(logits.dtype)


_COMPILED_CE = None


def _ce_chunk_fn(device: torch.device):
    global _COMPILED_CE
    if device.type != "cuda" or not compile_enabled():
        return _ce_chunk
    if _COMPILED_CE is None:
        _COMPILED_CE = torch.compile(_ce_chunk, dynamic=True)
    return _COMPILED_CE


class _ChunkedCE(torch.autograd.Function):
    """sum_i w_i * loss(lm_head(h_i), label_i) (``OBJECTIVES``) with the gradient computed chunkwise in forward."""

    @staticmethod
    def forward(ctx, h, weight, labels, w, soft_h, chunk, topk, objective):  # noqa: D401
        N = h.shape[0]
        top_ids = torch.empty(N, topk, dtype=torch.long, device=h.device)
        top_vals = torch.empty(N, topk, dtype=torch.float32, device=h.device)
        need_grad = ctx.needs_input_grad[0]
        grad_h = torch.empty_like(h) if need_grad else None
        total = torch.zeros((), dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
        pred = torch.empty(N, dtype=torch.long, device=h.device)
        judge = torch.empty(N, dtype=torch.long, device=h.device)
        ce_chunk = _ce_chunk_fn(h.device)
        for s in range(0, N, chunk):
            e = min(N, s + chunk)
            logits = h[s:e] @ weight.t()
            soft = None if soft_h is None else soft_h[s:e] @ weight.t()
            part, pred[s:e], judge[s:e], g = ce_chunk(logits, labels[s:e], w[s:e], soft, objective)
            if topk:  # in the logits' dtype: the same values as fp32 (bf16 -> fp32 is exact), no fp32 copy
                v, top_ids[s:e] = logits.detach().topk(topk, dim=-1)
                top_vals[s:e] = v
            total = total + part
            if need_grad:
                grad_h[s:e] = (g.to(weight.dtype) @ weight).to(h.dtype)
        if need_grad:
            ctx.save_for_backward(grad_h)
        ctx.mark_non_differentiable(pred, judge, top_ids, top_vals)
        return total, pred, judge, top_ids, top_vals

    @staticmethod
    def backward(ctx, grad_total, _grad_pred, _grad_judge, _grad_ids, _grad_vals):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_total.to(grad_h.dtype), None, None, None, None, None, None, None


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """``(block_size,)``: 0 for slot 0, ``exp(-(k-1)/gamma)`` for slot k >= 1."""
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma!r}")
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.exp(-(k - 1) / gamma) if math.isfinite(gamma) else torch.ones_like(k)
    w[0] = 0.0
    return w


def dflash_loss(
    draft_hidden: torch.Tensor,
    head: FrozenHead,
    input_ids: torch.Tensor,
    anchors: torch.Tensor,
    gamma: float,
    target_final_hidden: torch.Tensor | None = None,
    chunk_tokens: int = 4096,
    topk: int = 0,
    n_train: int | None = None,
    objective: str | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    B, A, bs, H = draft_hidden.shape
    if objective is None:
        objective = "data" if target_final_hidden is None else "kl"
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective != "data" and target_final_hidden is None:
        raise ValueError(f"objective {objective!r} needs target_final_hidden (the target's logits)")
    T = input_ids.shape[1]
    if anchors.shape != (B, A):
        raise ValueError(f"anchors {tuple(anchors.shape)} must be (B, A) = ({B}, {A})")
    n_train = A if n_train is None else n_train
    if not 0 <= n_train <= A:
        raise ValueError(f"n_train must be in 0 .. A = {A}, got {n_train}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    device = draft_hidden.device
    anchors = anchors.long()
    real = anchors >= 0  # (B, A): every real block, measuring ones included
    valid = real.clone()
    valid[:, n_train:] = False  # the training blocks: loss, gradient and the per-block metrics
    k = torch.arange(1, bs, device=device)
    tpos = anchors.unsqueeze(-1) + k  # (B, A, bs-1): position predicted by slot k
    real_ok = real.unsqueeze(-1) & (tpos < T)
    slot_ok = valid.unsqueeze(-1) & (tpos < T)
    tpos_c = tpos.clamp(0, T - 1)
    labels = torch.gather(input_ids, 1, tpos_c.view(B, -1)).view(B, A, bs - 1)
    w = position_weights(bs, gamma, device)[1:].expand(B, A, bs - 1) * slot_ok  # measuring blocks: 0

    h = draft_hidden[:, :, 1:, :].reshape(-1, H)
    soft_h = None
    if target_final_hidden is not None:
        if target_final_hidden.shape[:2] != (B, T):
            raise ValueError(f"target_final_hidden {tuple(target_final_hidden.shape)} must be (B, T, H)")
        src = (tpos_c - 1).clamp(min=0).view(B, -1)
        soft_h = torch.gather(target_final_hidden, 1, src.unsqueeze(-1).expand(-1, -1, H)).reshape(-1, H)
        soft_h = soft_h.to(head.lm_head.weight.dtype).detach()
    weight = head.lm_head.weight
    total, pred, judge, top_ids, top_vals = _ChunkedCE.apply(
        h.to(weight.dtype),
        weight,
        labels.reshape(-1),
        w.reshape(-1).float(),
        soft_h,
        chunk_tokens,
        topk,
        objective,
    )
    loss = total / w.sum().clamp(min=1e-12)

    with torch.no_grad():
        pred = pred.view(B, A, bs - 1)
        correct = (pred == labels) & slot_ok
        n_blocks = valid.sum()
        acc = correct.sum(dim=(0, 1)).float() / slot_ok.sum(dim=(0, 1)).clamp(min=1).float()
        accept_len = torch.cumprod(acc, dim=0).sum()
        # per block: the consecutive positions after the anchor a verify step would accept: the drafter's
        # argmax equal to the target's own argmax there (with soft labels: what a greedy verifier checks),
        # else to the data token (no target logits here)
        agree = (pred == judge.view(B, A, bs - 1)) & real_ok
        chain = agree.long().cumprod(dim=2).sum(dim=2) * real
        # the walk: over the measuring blocks (one run of consecutive anchors per row) when there are some,
        # else over the training blocks
        walk = slice(n_train, A) if n_train < A else slice(0, A)
        walk_tokens, walk_steps = decode_walk(anchors[:, walk], chain[:, walk], real[:, walk])
    metrics = {
        "acc": acc,
        "accept_len": accept_len,
        "n_blocks": n_blocks,
        "chain_sum": chain[:, :n_train].sum(),
        "walk_tokens": walk_tokens,
        "walk_steps": walk_steps,
    }
    if topk:
        metrics.update(topk_ids=top_ids, topk_values=top_vals, label_ids=judge.reshape(-1))
    return loss, metrics


def metrics_to_floats(metrics: dict[str, torch.Tensor]) -> dict:
    """One host sync: ``{"acc": [...], "accept_len": float, "n_blocks": int, "accept_len_est": float,
    "accept_len_est_uniform": float}``."""
    acc = metrics["acc"].detach().float()
    packed = torch.cat(
        [
            acc,
            *(
                metrics[k].detach().float().view(1)
                for k in ("accept_len", "n_blocks", "chain_sum", "walk_tokens", "walk_steps")
            ),
        ]
    )
    vals = packed.cpu().tolist()
    accept, blocks, chain, tokens, steps = vals[acc.numel() :]
    blocks = int(blocks)
    return {
        "acc": vals[: acc.numel()],
        "accept_len": accept,
        "n_blocks": blocks,
        "accept_len_est": tokens / steps if steps else None,
        "accept_len_est_uniform": 1.0 + chain / blocks if blocks else None,
    }
