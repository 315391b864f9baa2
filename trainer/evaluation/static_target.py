"""The target for decoding as servers run it: fixed-size caches, one forward per block size, CUDA graphs.

``StaticTarget(model, layer_ids, max_len, graph_sizes)`` has ``CachedTarget``'s interface (``prefill``,
``forward_block``, ``crop``, ``len``, ``rewind_forwards``, ``device``) for the decoders it knows: dense
pre-norm decoders (``direct.DIRECT_MODEL_TYPES`` without sliding layers) and Qwen3.5 / Qwen3.6 hybrid text
models (``hybrid.qualifies``, not MoE). ``static_target_problem(model)`` says why another is not taken (the
caller then uses ``CachedTarget``).

- Every attention layer's keys and values live in a ``(1, kv_heads, max_len, head_dim)`` buffer: a forward of
  ``T`` tokens at position ``p`` writes positions ``p .. p + T - 1`` (``index_copy_``) and attends over the
  whole buffer through a mask (key ``j`` visible to query ``p + t`` iff ``j <= p + t``), so ``crop`` only moves
  ``len``: what lies beyond it is never visible and is overwritten by the next forward.
- Every Gated DeltaNet layer's conv and recurrent state live in fixed buffers; its forward is
  ``linear_states._forward`` (the module's own projections, conv weights, gated norm, ``out_proj``; the states
  after every position of the block in closed form), so a verify forward keeps them all and ``crop`` copies in
  the one after the last kept position: the roll-back costs no forward (``rewind_forwards`` stays 0).
- The position is a device tensor, not a Python int, so one forward per block size serves every position.
  On CUDA (``graphs``) the forwards of ``graph_sizes`` tokens (1: target-only decoding; the block size: verify)
  are captured once as CUDA graphs (``graphs.Step``) at the first ``prefill``; other sizes, and the prefill
  (in chunks of at most ``linear_states.MAX_BLOCK`` tokens), run eagerly through the same code.

The layers' computation is transformers' (the modules' own norms, projections, MLP, rotary embedding); a test
checks logits, features and greedy output against the model's own cached forward on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.drafting.config import text_config_of
from trainer.drafting.rope import apply_rope
from trainer.evaluation.linear_states import MAX_BLOCK, _forward
from trainer.run.families import HYBRID_MODEL_TYPES
from trainer.target import hybrid
from trainer.target.base import decoder_of
from trainer.target.direct import DIRECT_MODEL_TYPES, layer_window


def static_target_problem(model) -> str | None:
    """None when ``StaticTarget`` can run ``model``, else why not."""
    tc = text_config_of(model.config)
    mt = getattr(tc, "model_type", None)
    if mt in HYBRID_MODEL_TYPES:
        if "moe" in mt:
            return f"model_type {mt!r}: mixture-of-experts blocks route per token (no static graph)"
        return None if hybrid.qualifies(model) else f"a {mt!r} model whose modules it does not know"
    if mt not in DIRECT_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {sorted(DIRECT_MODEL_TYPES | HYBRID_MODEL_TYPES)}"
    base = decoder_of(model)
    if any(layer_window(model, i) for i in range(len(base.layers))):
        return "sliding-window attention layers"
    return None


class _LinearState:
    """One Gated DeltaNet layer's state, laid out as transformers' cache layer (what ``_forward`` reads)."""

    def __init__(self, la, dtype, device):
        w = la.conv1d.weight
        heads = la.value_dim // la.head_v_dim
        self.conv_states = {0: torch.zeros(1, w.shape[0], w.shape[-1], dtype=dtype, device=device)}
        shape = (1, heads, la.head_k_dim, la.head_v_dim)
        self.recurrent_states = {0: torch.zeros(shape, dtype=torch.float32, device=device)}

    def zero(self) -> None:
        self.conv_states[0].zero_()
        self.recurrent_states[0].zero_()

    def select(self, rec, m: int) -> None:
        conv = self.conv_states[0]
        conv.copy_(rec.conv_in[..., m : m + conv.shape[-1]])
        self.recurrent_states[0].copy_(rec.states[:, :, m])


class StaticTarget:
    def __init__(self, model, layer_ids, max_len: int, graph_sizes=(), graphs: bool | None = None):
        problem = static_target_problem(model)
        if problem is not None:
            raise ValueError(f"static target: {problem}")
        self.model, self.layer_ids, self.max_len = model, list(layer_ids), int(max_len)
        base = decoder_of(model)
        self.base, self.layers = base, list(base.layers)
        self.hybrid = hybrid.qualifies(model)
        p = next(model.parameters())
        self.device, dtype = p.device, base.embed_tokens.weight.dtype
        self.kv, self.linear = {}, {}
        for i, layer in enumerate(self.layers):
            if getattr(layer, "linear_attn", None) is not None:
                self.linear[i] = _LinearState(layer.linear_attn, dtype, self.device)
            else:
                sa = layer.self_attn
                n_kv = sa.k_proj.out_features // sa.head_dim
                shape = (1, n_kv, self.max_len, sa.head_dim)
                self.kv[i] = tuple(torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(2))
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        self.graph_sizes = sorted({int(n) for n in graph_sizes})
        self.steps: dict = {}
        self.len, self.rewind_forwards = 0, 0
        self._undo = None  # (start, records) of the last rewindable forward_block

    # -- the forward ---------------------------------------------------------------------------------------
    def _rope(self, h: torch.Tensor, pos: torch.Tensor):
        if self.hybrid:  # text positions: t = h = w
            return self.base.rotary_emb(h, pos.unsqueeze(0).expand(3, *pos.shape))
        return self.base.rotary_emb(h, pos)

    def _attention(self, i: int, sa, x, cos, sin, pos, visible):
        B, T, _ = x.shape
        hd = sa.head_dim
        if self.hybrid:  # q and the output gate from q_proj; partial rotary
            q, gate = torch.chunk(sa.q_proj(x).view(B, T, -1, hd * 2), 2, dim=-1)
            gate = gate.reshape(B, T, -1)
        else:
            q, gate = sa.q_proj(x).view(B, T, -1, hd), None
        k, v = sa.k_proj(x).view(B, T, -1, hd), sa.v_proj(x).view(B, T, -1, hd)
        if getattr(sa, "q_norm", None) is not None:
            q, k = sa.q_norm(q), sa.k_norm(k)
        rope = hybrid._partial_rope if self.hybrid else (lambda t, c, s: apply_rope(t, c, s, unsqueeze_dim=2))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys, values = self.kv[i]
        keys.index_copy_(2, pos[0], k.transpose(1, 2).to(keys.dtype))
        values.index_copy_(2, pos[0], v.transpose(1, 2).to(values.dtype))
        qh = q.transpose(1, 2).to(values.dtype)
        o = F.scaled_dot_product_attention(
            qh, keys, values, attn_mask=visible, scale=sa.scaling, enable_gqa=qh.shape[1] != keys.shape[1]
        )
        o = o.transpose(1, 2).reshape(B, T, -1)
        return sa.o_proj(o if gate is None else o * torch.sigmoid(gate))

    def _run(self, ids: torch.Tensor, start: torch.Tensor):
        """ids (1, T) at positions ``start ..``: (logits (T, V), features (T, F), {layer: linear record})."""
        T = ids.shape[1]
        pos = (start + torch.arange(T, device=ids.device)).unsqueeze(0)
        h = self.base.embed_tokens(ids)
        cos, sin = self._rope(h, pos)
        visible = torch.arange(self.max_len, device=ids.device).unsqueeze(0) <= pos[0].unsqueeze(1)
        outs, records = {}, {}
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            if i in self.linear:
                o, records[i] = _forward(layer.linear_attn, self.linear[i], x)
            else:
                o = self._attention(i, layer.self_attn, x, cos, sin, pos, visible)
            h = h + o
            m = layer.mlp(layer.post_attention_layernorm(h))
            h = h + (m[0] if isinstance(m, tuple) else m)
            outs[i] = h
        feats = torch.cat([outs[i][0] for i in self.layer_ids], dim=-1)
        logits = self.model.lm_head(self.base.norm(h))[0]
        return logits, feats, records

    def _step(self, ids: list[int], start: int):
        step = self.steps.get(len(ids)) if self.use_graphs else None
        if step is None:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            s = torch.tensor(start, dtype=torch.long, device=self.device)
            with torch.no_grad():
                return self._run(x, s)
        x, s = step.inputs
        x.copy_(torch.tensor([ids], dtype=torch.long), non_blocking=False)
        s.fill_(start)
        return step()

    def _build_steps(self) -> None:
        from trainer.evaluation.graphs import try_step

        for n in self.graph_sizes:
            if n in self.steps or not 1 <= n <= MAX_BLOCK:
                continue
            x = torch.zeros(1, n, dtype=torch.long, device=self.device)
            s = torch.zeros((), dtype=torch.long, device=self.device)
            self.steps[n] = try_step(self._run, (x, s), self.device, f"the target's {n}-token forward")

    # -- CachedTarget's interface --------------------------------------------------------------------------
    def prefill(self, prompt: list[int], want_features: bool = True):
        if self.use_graphs and len(self.steps) < len([n for n in self.graph_sizes if n <= MAX_BLOCK]):
            self._build_steps()  # before the state is set: the warm-up runs write into it
        for st in self.linear.values():
            st.zero()
        self.len, self._undo = 0, None
        logits, feats = [], []
        for c in range(0, len(prompt), MAX_BLOCK):
            lg, ft = self.forward_block(list(prompt[c : c + MAX_BLOCK]), want_features)
            logits.append(lg[-1:].clone())
            feats.append(ft.clone() if ft is not None else None)
        return logits[-1], (torch.cat(feats, dim=0) if want_features else None)

    def forward_block(self, ids: list[int], want_features: bool = True, rewindable: bool = False):
        if not 1 <= len(ids) <= MAX_BLOCK:
            raise ValueError(f"static target: a forward of {len(ids)} tokens (1 .. {MAX_BLOCK})")
        if self.len + len(ids) > self.max_len:
            raise ValueError(
                f"static target: {self.len + len(ids)} positions, more than max_len {self.max_len}"
            )
        start = self.len
        logits, feats, records = self._step(ids, start)
        self.len += len(ids)
        self._undo = (start, records) if rewindable else None
        return logits, (feats if want_features else None)

    def crop(self, n: int) -> None:
        remove = self.len - n
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.len} positions to {n}")
        undo, self._undo = self._undo, None
        if not remove:
            return
        if self.linear:
            if undo is None or n < undo[0]:
                raise ValueError(
                    f"cannot crop a hybrid target's cache of {self.len} positions to {n}: linear-attention state "
                    "can only go back to the start of the last rewindable forward_block"
                )
            start, records = undo
            for i, st in self.linear.items():
                st.select(records[i], n - start)
        self.len = n
