"""The drafter at inference: its context K/V cached, one block proposed per call (``DrafterProposer``).

Training runs ``DFlashDrafter.forward`` over whole packed rows (context positions ``p < anchor`` visible to a
block, the block bidirectional). Decoding needs the same function for one block at a time, growing the
context by the features of the tokens the target accepted. The context enters every layer only through that
layer's ``k_proj``/``v_proj`` (+ ``k_norm`` and RoPE at the context positions) of ``hidden_norm(fc(features))``,
so its keys and values depend on nothing else and are cached per layer (``DraftContextCache``); a block's own
keys and values are computed in the call and never enter the cache. That is what the reference loop gets by
appending the block to its KV cache and cropping it back after each step: nothing to crop on a rejection.

``DrafterProposer(drafter, embed_tokens, lm_head)`` implements the proposal interface of the decoding loop
(``trainer.evaluation.spec_decode``): ``reset()`` and ``propose(tokens, new_features, temperature, generator)``.
A test checks its block output against ``DFlashDrafter.forward`` at the same anchor. A DFlash 2 drafter (one
with a ``candidate_selector``) runs its convolutions in every layer and proposes through the selector's walk
(``drafting.selector.walk``): greedy at temperature 0, sampled otherwise, with the walk's distribution over the
candidates (0 elsewhere) as the proposal probabilities, so rejection sampling stays lossless.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.drafting.rope import apply_rope
from trainer.drafting.selector import walk


class DraftContextCache:
    """Per-layer keys/values of the context positions ``0 .. len - 1``."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.k: list[torch.Tensor | None] = [None] * len(drafter.layers)
        self.v: list[torch.Tensor | None] = [None] * len(drafter.layers)
        self.len = 0

    @torch.no_grad()
    def extend(self, features: torch.Tensor) -> None:
        """Append the target features ``(n, num_captured * hidden)`` of the next ``n`` positions."""
        n = features.shape[0]
        if n == 0:
            return
        d = self.drafter
        dtype = d.fc.weight.dtype
        ctx = d.hidden_norm(d.fc(features.unsqueeze(0).to(dtype)))
        pos = torch.arange(self.len, self.len + n, device=features.device).unsqueeze(0)
        cos, sin = d._rope(pos, dtype)
        for i, layer in enumerate(d.layers):
            at = layer.self_attn
            k = apply_rope(at.k_norm(at._heads(at.k_proj(ctx), at.n_kv)).transpose(1, 2), cos, sin)
            v = at._heads(at.v_proj(ctx), at.n_kv).transpose(1, 2)
            self.k[i] = k if self.k[i] is None else torch.cat([self.k[i], k], dim=2)
            self.v[i] = v if self.v[i] is None else torch.cat([self.v[i], v], dim=2)
        self.len += n

    def _attn(self, h: torch.Tensor, at, i: int) -> torch.Tensor:
        """Layer ``i``'s attention of the block's (normed) input ``h`` ``(1, bs, H)`` over the cached context and
        the block itself."""
        d = self.drafter
        cfg = d.cfg
        bs = cfg.block_size
        dev = h.device
        a = self.len
        cos, sin = self._rope_q
        q = apply_rope(at.q_norm(at._heads(at.q_proj(h), at.n_heads)).transpose(1, 2), cos, sin)
        kb = apply_rope(at.k_norm(at._heads(at.k_proj(h), at.n_kv)).transpose(1, 2), cos, sin)
        vb = at._heads(at.v_proj(h), at.n_kv).transpose(1, 2)
        k = kb if self.k[i] is None else torch.cat([self.k[i], kb], dim=2)
        v = vb if self.v[i] is None else torch.cat([self.v[i], vb], dim=2)
        mask = None
        w = cfg.window_of(i)
        if w is not None and a > 0:
            slot = torch.arange(bs, device=dev).view(bs, 1)
            p = torch.arange(a, device=dev).view(1, a)
            ctx_ok = (a + slot) - p < w
            mask = torch.cat([ctx_ok, torch.ones(bs, bs, dtype=torch.bool, device=dev)], dim=1)
        q, k = q.to(v.dtype), k.to(v.dtype)
        if at.n_kv != at.n_heads:
            rep = at.n_heads // at.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(at.head_dim))
        return at.o_proj(out.transpose(1, 2).reshape(1, bs, at.n_heads * at.head_dim))

    @torch.no_grad()
    def block(self, anchor_token: int, embed_tokens) -> torch.Tensor:
        """The drafter's normed output ``(block_size, hidden)`` for the block anchored at position ``len``:
        slot 0 holds ``anchor_token``, slots 1.. the mask token; every cached context position is visible
        (``p < anchor``), within a sliding layer's window counted from each slot's own position."""
        d = self.drafter
        cfg = d.cfg
        bs = cfg.block_size
        dev = d.fc.weight.device
        dtype = d.fc.weight.dtype
        a = self.len
        ids = torch.full((1, bs), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = int(anchor_token)
        x = embed_tokens(ids).to(dtype)
        pos_q = torch.arange(a, a + bs, device=dev).unsqueeze(0)
        self._rope_q = d._rope(pos_q, dtype)
        for i, layer in enumerate(d.layers):
            x = x + layer.attn_block(
                layer.input_layernorm(x), lambda h, i=i, at=layer.self_attn: self._attn(h, at, i)
            )
            x = x + layer.mlp_block(layer.post_attention_layernorm(x))
        return d.norm(x)[0]


class Proposal:
    """``tokens`` ``(block_size - 1,)`` long: the proposed positions 1..; ``probs`` ``(block_size - 1, V)``
    the distribution each was drawn from (temperature > 0), or None (greedy: one-hot)."""

    def __init__(self, tokens: torch.Tensor, probs: torch.Tensor | None = None):
        self.tokens, self.probs = tokens, probs


class DrafterProposer:
    """The real drafter behind the decoding loop's proposal interface."""

    def __init__(self, drafter, embed_tokens, lm_head):
        self.drafter, self.embed_tokens, self.lm_head = drafter.eval(), embed_tokens, lm_head
        self.block_size = drafter.cfg.block_size
        self.cache = DraftContextCache(drafter)

    def reset(self) -> None:
        self.cache = DraftContextCache(self.drafter)

    @torch.no_grad()
    def propose(
        self,
        tokens: list[int],
        new_features: torch.Tensor,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Proposal:
        """Append the features of the newly accepted positions, then draft positions ``len(tokens) ..
        len(tokens) + block_size - 2`` from the anchor ``tokens[-1]`` (at position ``len(tokens) - 1``)."""
        self.cache.extend(new_features)
        if self.cache.len != len(tokens) - 1:
            raise RuntimeError(
                f"drafter context holds {self.cache.len} positions, expected {len(tokens) - 1} "
                "(every accepted token but the anchor)"
            )
        h = self.cache.block(tokens[-1], self.embed_tokens)[1:]
        logits = self.lm_head(h.to(self.lm_head.weight.dtype)).float()
        selector = getattr(self.drafter, "candidate_selector", None)
        if selector is not None:  # DFlash 2: the selector's walk over the top-k candidates of every slot
            return self._walk(selector, h, logits, tokens[-1], temperature, generator)
        if temperature <= 0:
            return Proposal(logits.argmax(-1))
        probs = torch.softmax(logits / temperature, dim=-1)
        return Proposal(torch.multinomial(probs, 1, generator=generator).view(-1), probs)

    @staticmethod
    def _walk(selector, h, logits, anchor, temperature, generator) -> Proposal:
        unary, cand = logits.topk(selector.top_k, dim=-1)
        edges = selector.edge_scores(h, cand, unary, anchor)
        idx, dists = walk(edges, temperature, generator)
        tokens = cand.gather(1, idx.unsqueeze(1)).view(-1)
        if dists is None:
            return Proposal(tokens)
        probs = torch.zeros_like(logits).scatter_(1, cand, dists.to(logits.dtype))  # 0 outside the candidates
        return Proposal(tokens, probs)
