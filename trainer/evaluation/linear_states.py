"""The Gated DeltaNet states after every position of a verify forward: roll-back without a second forward.

A hybrid target's linear-attention layer (Qwen3.5 / Qwen3.6 ``*GatedDeltaNet``) carries a conv state (its last
few pre-conv inputs) and a recurrent state (a ``Dk x Dv`` matrix per value head) from token to token; after a
verify forward over ``[anchor, drafts...]`` both have absorbed the rejected drafts too. Serving stacks (vLLM,
SGLang) keep the state of every verified position and pick the one at the accepted length. So does this:

- ``gated_delta_states(q, k, v, g, beta, s0)``: the gated delta rule over a block of ``T`` positions from the
  state ``s0``, returning the outputs *and* the state after every position, in closed form (one chunk of the
  chunked algorithm: a ``T x T`` triangular solve for the corrected values, then every prefix's state at
  once: ``S_t = exp(c_t) s0 + sum_{j <= t} exp(c_t - c_j) k_j u_j^T``); a few batched matmuls whatever ``T``,
  no per-position loop;
- ``LinearStates(model)``: finds the model's Gated DeltaNet modules; ``recording(cache)`` (a context manager,
  installed only around one verify forward) runs our own forward on each of them (the module's own
  projections, conv weights, gated norm, ``out_proj``; plain PyTorch on every device, whatever kernels
  transformers would pick: fla, causal-conv1d or its torch fallbacks), leaves the cache as transformers would
  (the state after the block) and keeps each layer's per-position conv inputs and recurrent states;
  ``select(cache, m)`` then sets every linear layer's state to the one after the first ``m`` positions of the
  block (``m = 0``: as before it), copying in place (the cache keeps its tensors).

Transformers 5.17 and 5.24 name the module's cache argument differently (``cache_params`` / ``cache``); our
forward ignores it and reads the cache it was given. A model whose linear modules lack the attributes used
here (another family's layout) is reported by ``LinearStates.problem`` and the caller falls back to a replay.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MAX_BLOCK = 64  # one chunk of the chunked rule; verify blocks are <= 16
_ATTRS = (
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm", "out_proj",
    "layer_idx", "head_k_dim", "head_v_dim", "key_dim", "value_dim", "activation",
)  # fmt: skip


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_states(q, k, v, g, beta, s0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k (B, T, Hk, Dk), v (B, T, H, Dv), g/beta (B, T, H), s0 (B, H, Dk, Dv) (H a multiple of Hk: each
    key head serves H / Hk consecutive value heads). q and k are L2-normalised, q scaled by Dk^-0.5 (as
    transformers' ``use_qk_l2norm_in_kernel=True``). Returns the outputs (B, T, H, Dv) in v's dtype and the
    states (B, H, T + 1, Dk, Dv) in fp32: index 0 is ``s0``, index t the state after position t."""
    T, H, Dk = k.shape[1], v.shape[2], k.shape[-1]
    if k.shape[2] != H:
        q, k = (x.repeat_interleave(H // x.shape[2], dim=2) for x in (q, k))
    q, k, v, beta, g = (x.transpose(1, 2).float() for x in (q, k, v, beta, g))
    q, k = _l2norm(q) * Dk**-0.5, _l2norm(k)
    s0 = s0.float()
    cum = g.cumsum(-1)  # (B, H, T): log of the decay from the block's start through t
    upper = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()  # [t, j], j <= t
    # u_t = beta_t (v_t - k_t^T exp(g_t) S_{t-1}): unit lower-triangular system in the u_j, j < t
    system = (beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = system + torch.eye(T, dtype=system.dtype, device=system.device)
    rhs = beta.unsqueeze(-1) * (v - cum.exp().unsqueeze(-1) * (k @ s0))
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    states = cum.exp()[..., None, None] * s0.unsqueeze(2) + torch.einsum("bhtj,bhjk,bhjv->bhtkv", decay, k, u)
    out = torch.einsum("bhtk,bhtkv->bhtv", q, states)
    return out.transpose(1, 2).to(v.dtype), torch.cat([s0.unsqueeze(2), states], dim=2)


@dataclass
class _Record:
    """One layer's block: its pre-conv inputs with the conv state before them, (B, C, L + T), and its
    recurrent states before and after every position, (B, H, T + 1, Dk, Dv)."""

    conv_in: torch.Tensor
    states: torch.Tensor


def _linear_modules(model) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


class LinearStates:
    """The per-position states of a model's Gated DeltaNet layers over one recorded forward."""

    def __init__(self, model):
        self.modules = _linear_modules(model)
        self.records: dict[int, _Record] = {}
        missing = sorted({a for m in self.modules for a in _ATTRS if not hasattr(m, a)})
        self.problem = None
        if not self.modules:
            self.problem = "no *GatedDeltaNet module found in the target"
        elif missing:
            self.problem = f"{type(self.modules[0]).__name__} lacks {', '.join(missing)}"

    def layer_ids(self) -> set[int]:
        return {int(m.layer_idx) for m in self.modules}

    @contextmanager
    def recording(self, cache):
        """While the block runs, every Gated DeltaNet module runs ``_forward`` on ``cache`` and records."""
        self.records = {}
        saved = [m.__dict__.get("forward") for m in self.modules]  # an instance-level forward (hooks), if any
        for m in self.modules:
            m.forward = _bound(self, m, cache)
        try:
            yield self
        finally:
            for m, prev in zip(self.modules, saved, strict=True):
                if prev is None:
                    del m.forward  # back to the class's forward
                else:
                    m.forward = prev
        if len(self.records) != len(self.modules):
            raise RuntimeError(f"recorded {len(self.records)} of {len(self.modules)} linear-attention layers")

    def select(self, cache, m: int) -> None:
        """Every recorded layer's conv and recurrent state as after the first ``m`` positions of the block."""
        for idx, rec in self.records.items():
            layer = cache.layers[idx]
            conv = layer.conv_states[0]
            conv.copy_(rec.conv_in[..., m : m + conv.shape[-1]])
            layer.recurrent_states[0].copy_(rec.states[:, :, m])
        self.records = {}


def _bound(rec: LinearStates, module, cache):
    def forward(hidden_states, *args, attention_mask=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("per-position linear-attention states: padded inputs are not supported")
        out, record = _forward(module, cache.layers[module.layer_idx], hidden_states)
        rec.records[int(module.layer_idx)] = record
        return out

    return forward


def _forward(la, layer, x: torch.Tensor) -> tuple[torch.Tensor, _Record]:
    """The Gated DeltaNet forward of ``la`` over x (B, T, hidden) after the states in cache ``layer``, as
    transformers computes it; leaves the state after the block in ``layer`` and returns the record."""
    from transformers.activations import ACT2FN

    B, T, _ = x.shape
    conv_state, s0 = layer.conv_states[0], layer.recurrent_states[0]
    qkv = la.in_proj_qkv(x).transpose(1, 2)  # (B, C, T)
    z = la.in_proj_z(x).reshape(B, T, -1, la.head_v_dim)
    b, a = la.in_proj_b(x), la.in_proj_a(x)
    w = la.conv1d.weight  # (C, 1, K)
    conv_in = torch.cat([conv_state.to(qkv.dtype), qkv], dim=-1)
    mixed = F.conv1d(conv_in.to(w.dtype), w, la.conv1d.bias, groups=w.shape[0])[..., -T:]
    mixed = ACT2FN[la.activation](mixed).to(x.dtype).transpose(1, 2)
    q, k, v = torch.split(mixed, [la.key_dim, la.key_dim, la.value_dim], dim=-1)
    q, k = q.reshape(B, T, -1, la.head_k_dim), k.reshape(B, T, -1, la.head_k_dim)
    v = v.reshape(B, T, -1, la.head_v_dim)
    beta = b.sigmoid()
    g = -la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias)
    core, states = gated_delta_states(q, k, v, g, beta, s0)
    core = core.to(x.dtype)  # computed in fp32: the norm and out_proj run in the model's dtype (bf16 on GPU)
    conv_state.copy_(conv_in[..., -conv_state.shape[-1] :])
    s0.copy_(states[:, :, -1])
    core = la.norm(core.reshape(-1, la.head_v_dim), z.reshape(-1, la.head_v_dim)).reshape(B, T, -1)
    return la.out_proj(core), _Record(conv_in, states)


def can_record(cache, rec: LinearStates, block_len: int) -> bool:
    """Whether the next forward of ``block_len`` tokens can be recorded: every Gated DeltaNet layer has a
    conv and a recurrent state in the cache already (after the prefill), of fixed size (transformers'
    ``record_past`` off), and the block is one chunk."""
    if rec.problem is not None or cache is None or not 1 <= block_len <= MAX_BLOCK:
        return False
    for idx in rec.layer_ids():
        layer = cache.layers[idx] if idx < len(cache.layers) else None
        conv = getattr(layer, "conv_states", {}).get(0) if layer is not None else None
        rs = getattr(layer, "recurrent_states", {}).get(0) if layer is not None else None
        if getattr(layer, "record_past", False):
            return False
        flags = getattr(layer, "has_previous_state", None)
        if not (torch.is_tensor(conv) and torch.is_tensor(rs)) or (
            isinstance(flags, dict) and not flags.get(0)
        ):
            return False
    return True
