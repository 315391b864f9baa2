"""The drafter for decoding as servers run it: its context keys/values in fixed buffers, one proposal step per
call, captured as a CUDA graph on CUDA.

``StaticProposer(drafter, embed_tokens, lm_head, max_len)`` has ``drafter_cache.DrafterProposer``'s interface
(``reset``, ``propose(tokens, new_features, temperature, generator) -> Proposal``) and computes the same
function: every layer's context keys/values (``k_proj`` / ``v_proj`` + ``k_norm`` and RoPE of
``hidden_norm(fc(features))``) are written into ``(1, kv_heads, max_len, head_dim)`` buffers at their
positions, and the block (slot 0 the anchor, the others the mask token) attends over the buffer through a
mask (context positions ``p < anchor``, within a sliding layer's window from each slot) and over itself.

One step does both halves: the features of the up to ``block_size`` newly accepted positions (zero-padded to
``block_size``; the padding is written past the context, where no block sees it and the next step overwrites
it), then the block, its logits and, at temperature 0, its tokens (DFlash 1: the argmax; DFlash 2: the
selector's greedy walk over the top-k candidates), all on the device with no host sync. The prompt's features
(more than a block) go in eagerly first. At temperature > 0 the step stops at the logits and the sampling (and
a DFlash 2 walk) run eagerly as ``DrafterProposer`` runs them. A test checks the proposals against
``DrafterProposer``'s.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainer.drafting.rope import apply_rope
from trainer.drafting.selector import walk
from trainer.evaluation.drafter_cache import DrafterProposer, Proposal


class StaticProposer:
    def __init__(self, drafter, embed_tokens, lm_head, max_len: int, graphs: bool | None = None):
        self.eager = DrafterProposer(drafter, embed_tokens, lm_head)
        self.drafter, self.embed_tokens, self.lm_head = self.eager.drafter, embed_tokens, lm_head
        d, cfg = self.drafter, self.drafter.cfg
        self.block_size, self.max_len = cfg.block_size, int(max_len)
        self.device, self.dtype = d.fc.weight.device, d.fc.weight.dtype
        self.kv = []
        for layer in d.layers:
            at = layer.self_attn
            shape = (1, at.n_kv, self.max_len, at.head_dim)
            self.kv.append(tuple(torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2)))
        z = torch.zeros((), dtype=torch.long, device=self.device)
        self.inputs = (
            torch.zeros(self.block_size, d.fc.in_features, dtype=self.dtype, device=self.device),
            z.clone(),
            z.clone(),
            z.clone(),
        )  # fmt: skip: (new features padded, context length before them, how many, the anchor token)
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        self.steps: dict = {}  # greedy (True / False) -> graphs.Step
        self.len = 0

    def reset(self) -> None:
        self.len = 0

    # -- the computation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _write_context(self, feats: torch.Tensor, start) -> None:
        """Every layer's context keys/values of ``feats`` (n, F) at positions ``start .. start + n - 1``."""
        d = self.drafter
        ctx = d.hidden_norm(d.fc(feats.unsqueeze(0).to(self.dtype)))
        pos = (start + torch.arange(feats.shape[0], device=self.device)).unsqueeze(0)
        cos, sin = d._rope(pos, self.dtype)
        for layer, (keys, values) in zip(d.layers, self.kv, strict=True):
            at = layer.self_attn
            k = apply_rope(at.k_norm(at._heads(at.k_proj(ctx), at.n_kv)).transpose(1, 2), cos, sin)
            keys.index_copy_(2, pos[0], k.to(keys.dtype))
            values.index_copy_(2, pos[0], at._heads(at.v_proj(ctx), at.n_kv).transpose(1, 2).to(values.dtype))

    def _mask(self, i: int, a) -> torch.Tensor:
        """(bs, max_len + bs): slot ``s`` (position ``a + s``) sees context position ``p < a`` (within layer
        ``i``'s window) and the whole block."""
        bs, dev = self.block_size, self.device
        p = torch.arange(self.max_len, device=dev).view(1, -1)
        ok = (p < a).expand(bs, -1)
        w = self.drafter.cfg.window_of(i)
        if w is not None:
            ok = ok & ((a + torch.arange(bs, device=dev).view(bs, 1)) - p < w)
        return torch.cat([ok, torch.ones(bs, bs, dtype=torch.bool, device=dev)], dim=1)

    def _attn(self, h, at, i: int, rope_q, a) -> torch.Tensor:
        bs = self.block_size
        q = apply_rope(at.q_norm(at._heads(at.q_proj(h), at.n_heads)).transpose(1, 2), *rope_q)
        kb = apply_rope(at.k_norm(at._heads(at.k_proj(h), at.n_kv)).transpose(1, 2), *rope_q)
        vb = at._heads(at.v_proj(h), at.n_kv).transpose(1, 2)
        keys, values = self.kv[i]
        k = torch.cat([keys, kb.to(keys.dtype)], dim=2)
        v = torch.cat([values, vb.to(values.dtype)], dim=2)
        out = F.scaled_dot_product_attention(
            q.to(v.dtype), k, v, attn_mask=self._mask(i, a), scale=1.0 / math.sqrt(at.head_dim),
            enable_gqa=at.n_kv != at.n_heads,
        )  # fmt: skip
        return at.o_proj(out.transpose(1, 2).reshape(1, bs, at.n_heads * at.head_dim))

    @torch.no_grad()
    def _run(self, feats, start, n, anchor, greedy: bool):
        """One step: write the new features' context, then the block anchored at ``start + n``: (its normed
        output (bs - 1, H) of the drafted slots, their logits (bs - 1, V) fp32, greedy tokens or None)."""
        d, bs = self.drafter, self.block_size
        self._write_context(feats, start)
        a = start + n
        mask_id = torch.full((bs - 1,), d.cfg.mask_token_id, dtype=torch.long, device=self.device)
        x = self.embed_tokens(torch.cat([anchor.view(1), mask_id]).view(1, bs)).to(self.dtype)
        rope_q = d._rope((a + torch.arange(bs, device=self.device)).unsqueeze(0), self.dtype)
        for i, layer in enumerate(d.layers):
            attn = lambda h, i=i, at=layer.self_attn: self._attn(h, at, i, rope_q, a)  # noqa: E731
            x = x + layer.attn_block(layer.input_layernorm(x), attn)
            x = x + layer.mlp_block(layer.post_attention_layernorm(x))
        h = d.norm(x)[0][1:]
        logits = self.lm_head(h.to(self.lm_head.weight.dtype)).float()
        return h, logits, (self._greedy(h, logits, anchor) if greedy else None)

    def _greedy(self, h, logits, anchor) -> torch.Tensor:
        selector = getattr(self.drafter, "candidate_selector", None)
        if selector is None:
            return logits.argmax(-1)
        unary, cand = logits.topk(selector.top_k, dim=-1)
        prev = torch.cat([anchor.view(1, 1).expand(1, cand.shape[1]), cand[:-1]], dim=0)
        edges = unary.float().unsqueeze(1) + selector.transition(h, prev, cand).float()
        idx, _ = walk(edges, 0.0)
        return cand.gather(1, idx.unsqueeze(1)).view(-1)

    # -- DrafterProposer's interface -----------------------------------------------------------------------
    def _step(self, greedy: bool):
        if not self.use_graphs:
            return self._run(*self.inputs, greedy)
        if greedy not in self.steps:
            from trainer.evaluation.graphs import try_step

            saved = [(k.clone(), v.clone()) for k, v in self.kv]  # the warm-up runs write into the buffers
            fn = lambda *t: self._run(*t, greedy)  # noqa: E731
            self.steps[greedy] = try_step(fn, self.inputs, self.device, "the drafter's step")
            for (k, v), (k0, v0) in zip(self.kv, saved, strict=True):
                k.copy_(k0)
                v.copy_(v0)
        step = self.steps[greedy]
        return step() if step is not None else self._run(*self.inputs, greedy)

    def propose(self, tokens, new_features, temperature, generator) -> Proposal:
        n, bs = int(new_features.shape[0]), self.block_size
        if self.len + n != len(tokens) - 1:
            raise RuntimeError(
                f"drafter context holds {self.len + n} positions, expected {len(tokens) - 1} "
                "(every accepted token but the anchor)"
            )
        if self.len + n + bs > self.max_len:
            raise ValueError(
                f"static drafter: {self.len + n + bs} positions, more than max_len {self.max_len}"
            )
        feats, start, count, anchor = self.inputs
        if n > bs:  # the prompt's features: written as they are, then a step with none new
            self._write_context(new_features, self.len)
            self.len, n = self.len + n, 0
        feats.zero_()
        feats[:n].copy_(new_features[:n])
        start.fill_(self.len)
        count.fill_(n)
        anchor.fill_(int(tokens[-1]))
        h, logits, greedy = self._step(temperature <= 0)
        self.len += n
        if greedy is not None:
            return Proposal(greedy.clone())
        return self._sample(h, logits, int(tokens[-1]), temperature, generator)

    def _sample(self, h, logits, anchor: int, temperature: float, generator) -> Proposal:
        selector = getattr(self.drafter, "candidate_selector", None)
        if selector is not None:
            return DrafterProposer._walk(selector, h, logits, anchor, temperature, generator)
        probs = torch.softmax(logits / temperature, dim=-1)
        return Proposal(torch.multinomial(probs, 1, generator=generator).view(-1), probs)
