"""Per-document capture for hybrid linear-attention targets (Qwen3.5 / Qwen3.6, dense and MoE).

Their decoders interleave Gated DeltaNet layers (a causal depthwise conv of width K, then a recurrent
gated delta rule) with gated full-attention layers. transformers runs the conv and the recurrence over a
whole packed row, so every document after the first starts from the previous documents' conv and
recurrent state (measured: 4-17 % relative error on the captured features). Here each document of a row
starts from zero state, at any length (1 token, shorter or longer than K):

- the conv is computed per document: ``out[t] = sum_j w[K-1-j] * x[t-j]`` over the taps ``j`` whose token
  ``t-j`` is in ``t``'s document (plain PyTorch, both devices);
- the gated delta rule per document: on CPU our own chunked form in plain PyTorch (the documents gathered
  into a padded batch, each from a zero state); on CUDA flash-linear-attention's
  ``chunk_gated_delta_rule`` with ``cu_seqlens`` (variable-length: each document from a zero state);
- full-attention layers (output gate, partial rotary with the decoder's own ``rotary_emb``, zero-centred
  q/k norms) attend within each document through ``attention.attend`` (varlen / flex on CUDA, a dense
  document-causal mask on CPU).

Everything runs on the layers' own modules and weights (projections, norms, MLP / MoE block, the gated
output norm); no transformers mask building, cache or kernel routing is involved, so an installed fla
does not change the CPU path. ``prepare_hybrid(model)`` qualifies a model, picks the backends and attaches
a ``HybridCapture``, which ``capture.capture`` calls: ONE loop over the layers (embed, per-document
positions, each layer, the captured slots, the final norm) on one of two layouts, each with its own
per-batch metadata (``_Batch``) and its own way of running a Gated DeltaNet or an attention layer:

- ``_Rows`` (``fast=False``; the CPU default, the issue-14 path): the rows as they are, every layer eager
  (``linear_mixer``: the conv on each row per document, the rule with q/k repeated to the value heads,
  transformers' own gated norm module; ``attn_step``);
- ``_Flat`` (``fast=True``; the CUDA default): the same computation on the rows flattened to one sequence
  of ``B * T`` tokens (every row start is a document start), as regions compiled once, so that one graph
  serves every layer and every batch of that many tokens:

  - ``linear_in`` (compiled): input norm, the input projections (q, k and v each by its row slice of
    ``in_proj_qkv``; an FP8 target's ``fp8.Fp8Linear`` by its ``forward_rows``), the per-document conv +
    SiLU (fp32 inside, contiguous bf16 out: on CUDA ``doc_conv``'s Triton kernel, one read of each input,
    selected where it checks against the reference; else ``_conv_silu``, the reference, ``K`` shifted taps
    masked by "same document"), ``beta`` and the decay ``g``;
  - the gated delta rule: flash-linear-attention's varlen ``chunk_gated_delta_rule`` with ``cu_seqlens``
    (and its host copy: no device sync) on the 16 key heads as they are (the kernel's grouped-value form:
    each key head serves ``Hv / Hk`` consecutive value heads, as ``repeat_interleave`` does; nothing is
    repeated); plain PyTorch on CPU (there q/k are repeated);
  - ``linear_out`` (compiled): the gated RMS norm, ``out_proj``, residual, post norm, MLP, residual;
  - ``attn_step`` (compiled): a whole gated-attention layer (varlen attention inside, as ``direct`` does).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainer.drafting.compiling import compile_enabled
from trainer.drafting.config import text_config_of
from trainer.drafting.masks import doc_positions
from trainer.run.families import FLA_PACKAGE, HYBRID_MODEL_TYPES
from trainer.target import doc_conv
from trainer.target.attention import attend, dense_mask, doc_starts, flex_mask, varlen_meta, varlen_works
from trainer.target.base import Capture, attach, check_layer_ids, decoder_of, store_layer
from trainer.target.fp8 import Fp8Linear

CHUNK = 64


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def fla_missing_message() -> str:
    return (
        f"a hybrid linear-attention target on CUDA needs the {FLA_PACKAGE} package (import name 'fla'; "
        "pip install '.[gpu]', or the fla_core + flash_linear_attention wheels) for per-document "
        "(variable-length) Gated DeltaNet kernels; it is not installed"
    )


# -- the per-document causal conv ------------------------------------------------------------------------
def causal_conv_docs(x: torch.Tensor, weight: torch.Tensor, bias, doc: torch.Tensor) -> torch.Tensor:
    """x (B, T, C), weight (C, K), doc (B, T) -> (B, T, C): depthwise causal conv within each document."""
    B, T, C = x.shape
    K = weight.shape[-1]
    w = weight.float()
    xf = x.float()
    out = xf * w[:, K - 1]
    for j in range(1, min(K, T)):
        same = (doc[:, j:] == doc[:, :-j]).unsqueeze(-1)  # token t-j is in t's document
        tap = xf[:, :-j] * w[:, K - 1 - j]
        out[:, j:] += tap * same
    if bias is not None:
        out = out + bias.float()
    return out


# -- the gated delta rule -----------------------------------------------------------------------------------
def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta(q, k, v, g, beta, chunk: int = CHUNK) -> torch.Tensor:
    """The gated delta rule from a zero state, chunked; plain PyTorch, fp32.

    q/k (N, L, H, Dk), v (N, L, H, Dv), g/beta (N, L, H) with H value heads (q/k already repeated to
    them); q and k are L2-normalised here and q scaled by Dk^-0.5. Returns (N, L, H, Dv)."""
    N, L, H, Dk = k.shape
    Dv = v.shape[-1]
    q, k, v, beta, g = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, beta, g))
    q = _l2norm(q) * Dk**-0.5
    k = _l2norm(k)
    pad = (chunk - L % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n = (L + pad) // chunk
    v_beta = (v * beta.unsqueeze(-1)).view(N, H, n, chunk, Dv)
    k_beta = (k * beta.unsqueeze(-1)).view(N, H, n, chunk, Dk)
    q, k = q.view(N, H, n, chunk, Dk), k.view(N, H, n, chunk, Dk)
    cum = g.view(N, H, n, chunk).cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay  # unit lower triangular (the diagonal is 1)
    system = system.masked_fill(~torch.ones_like(upper).tril(-1), 0.0) + torch.eye(chunk, device=q.device)
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    intra = ((q @ k.transpose(-1, -2)) * decay).masked_fill(upper, 0.0)
    q_dec = q * cum.exp().unsqueeze(-1)
    k_dec = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    state = q.new_zeros(N, H, Dk, Dv)
    out = torch.empty_like(u)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        out[:, :, i] = q_dec[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    return out.reshape(N, H, -1, Dv)[:, :, :L].transpose(1, 2)


def _segments(doc_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each document over the flattened rows (host)."""
    B, T = doc_ids.shape
    starts = torch.nonzero(doc_starts(doc_ids.cpu()).flatten()).flatten().tolist()
    return list(zip(starts, [*starts[1:], B * T], strict=True))


def gated_delta_docs(q, k, v, g, beta, batch: _Batch, linear: str) -> torch.Tensor:
    """Per-document gated delta rule over (B, T, ...) tensors; q/k (B, T, H, Dk) with H value heads.
    ``linear`` ``"fla"`` reads ``batch.cu``, ``"torch"`` ``batch.segments``."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    flat = [x.reshape(B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
    if linear == "fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, _ = chunk_gated_delta_rule(
            *(x.unsqueeze(0) for x in flat[:3]),
            flat[3].unsqueeze(0).float(),
            flat[4].unsqueeze(0),
            cu_seqlens=batch.cu.long(),
            use_qk_l2norm_in_kernel=True,
        )
        return o.reshape(B, T, H, Dv).to(v.dtype)
    segs = batch.segments
    lmax = max(e - s for s, e in segs)
    padded = [
        torch.stack([F.pad(x[s:e], (0, 0) * (x.dim() - 1) + (0, lmax - (e - s))) for s, e in segs])
        for x in flat
    ]
    o = chunk_gated_delta(*padded)
    return torch.cat([o[i, : e - s] for i, (s, e) in enumerate(segs)]).reshape(B, T, H, Dv).to(v.dtype)


# -- the layers ------------------------------------------------------------------------------------------------
def linear_mixer(la: nn.Module, x: torch.Tensor, batch: _Batch, linear: str) -> torch.Tensor:
    """A Gated DeltaNet module's forward on x (B, T, H) with every document from zero state."""
    B, T, _ = x.shape
    dk, dv = la.head_k_dim, la.head_v_dim
    qkv = la.in_proj_qkv(x)
    z = la.in_proj_z(x).reshape(B, T, -1, dv)
    b = la.in_proj_b(x)
    a = la.in_proj_a(x)
    qkv = F.silu(
        causal_conv_docs(qkv, la.conv1d.weight.reshape(qkv.shape[-1], -1), la.conv1d.bias, batch.doc)
    )
    qkv = qkv.to(x.dtype)
    q, k, v = torch.split(qkv, [la.key_dim, la.key_dim, la.value_dim], dim=-1)
    q, k, v = q.reshape(B, T, -1, dk), k.reshape(B, T, -1, dk), v.reshape(B, T, -1, dv)
    rep = v.shape[2] // q.shape[2]
    if rep > 1:  # each key head serves `rep` consecutive value heads
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    beta = b.sigmoid()
    g = -la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias)
    o = gated_delta_docs(q, k, v, g, beta, batch, linear)
    o = la.norm(o.reshape(-1, dv), z.reshape(-1, dv)).reshape(B, T, -1)
    return la.out_proj(o)


def _partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D); cos/sin (B, T, R) with R <= D: rotate the first R dims (rotate-half form)."""
    r = cos.shape[-1]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2 :]
    rot = torch.cat((-x2, x1), dim=-1)
    return torch.cat((xr * cos + rot * sin, xp), dim=-1)


def attention_mixer(sa: nn.Module, x: torch.Tensor, cos, sin, attn: str, meta) -> torch.Tensor:
    """A gated attention module's forward (q and output gate from q_proj) within each document."""
    B, T, _ = x.shape
    hd = sa.head_dim
    q, gate = torch.chunk(sa.q_proj(x).view(B, T, -1, hd * 2), 2, dim=-1)
    gate = gate.reshape(B, T, -1)
    q = sa.q_norm(q)
    k = sa.k_norm(sa.k_proj(x).view(B, T, -1, hd))
    v = sa.v_proj(x).view(B, T, -1, hd)
    q = _partial_rope(q, cos, sin).to(v.dtype)
    k = _partial_rope(k, cos, sin).to(v.dtype)
    o = attend(q, k, v, sa.scaling, None, attn, meta).reshape(B, T, -1)
    return sa.o_proj(o * torch.sigmoid(gate))


def _is_linear(layer: nn.Module) -> bool:
    return getattr(layer, "linear_attn", None) is not None


def _mlp(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    m = layer.mlp(layer.post_attention_layernorm(h))
    if isinstance(m, tuple):
        m = m[0]
    return h + m


def attn_step(layer: nn.Module, h: torch.Tensor, cos, sin, attn: str, meta) -> torch.Tensor:
    """A whole gated-attention layer on h (B, T, H) (flattened: (1, N, H)), attention within each document."""
    x = layer.input_layernorm(h)
    return _mlp(layer, h + attention_mixer(layer.self_attn, x, cos, sin, attn, meta))


# -- the fast path's regions: flattened rows ---------------------------------------------------------------
def _conv_silu(x: torch.Tensor, weight: torch.Tensor, bias, taps: torch.Tensor) -> torch.Tensor:
    """x (1, N, C), weight (C, K), taps (K-1, N) bool (token t-j is in t's document) -> silu(conv) fp32."""
    K = weight.shape[-1]
    w = weight.float()
    xf = x.float()
    out = xf * w[:, K - 1]
    for j in range(1, K):
        out = out + torch.roll(xf, j, dims=1) * w[:, K - 1 - j] * taps[j - 1].view(1, -1, 1)
    if bias is not None:
        out = out + bias.float()
    return F.silu(out)


def _gated_norm(x: torch.Tensor, gate: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Qwen3.5's gated RMS norm (norm, weight, then * silu(gate)) on the module's weight and epsilon."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (norm.weight * xf.to(dt) * F.silu(gate.float())).to(dt)


def _rows(proj: nn.Module, x: torch.Tensor, spans) -> list[torch.Tensor]:
    """``proj``'s outputs of its weight rows ``[s, s + n)`` for each ``(s, n)``: row slices of a bf16 weight
    (no copy); an ``Fp8Linear``'s own (one activation quantisation for all)."""
    if isinstance(proj, Fp8Linear):
        return proj.forward_rows(x, spans)
    W, b = proj.weight, proj.bias
    return [F.linear(x, W[s : s + n], None if b is None else b[s : s + n]) for s, n in spans]


def linear_in(layer: nn.Module, h: torch.Tensor, taps: torch.Tensor, conv: str | None = None):
    """h (1, N, H) -> q, k (1, N, Hk, Dk), v (1, N, Hv, Dv) after conv + SiLU; z (1, N, Hv*Dv); g, beta.

    q, k and v are projected by three row slices of ``in_proj_qkv`` (no copy) and convolved separately:
    each comes out contiguous from one fused kernel, where one projection then a split would need the
    convolved whole materialised and copied again (measured: 2.9 ms per layer on the H200 at 49,152 tokens).
    ``conv``: the conv by that one of ``doc_conv.KERNELS`` (one read of each input; ``taps`` are a packed row's,
    as ``_flat_meta`` gives them), else (None) ``_conv_silu``."""
    la = layer.linear_attn
    N = h.shape[1]
    x = layer.input_layernorm(h)
    kd, vd = la.key_dim, la.value_dim
    spans = ((0, kd), (kd, kd), (2 * kd, vd))
    cw = la.conv1d.weight.reshape(2 * kd + vd, -1)
    cb = la.conv1d.bias
    out = []
    dims = (la.head_k_dim, la.head_k_dim, la.head_v_dim)
    for (s, n), d, y in zip(spans, dims, _rows(la.in_proj_qkv, x, spans), strict=True):
        fn = doc_conv.KERNELS[conv][0] if conv and doc_conv.usable(y, taps) else _conv_silu
        y = fn(y, cw[s : s + n], None if cb is None else cb[s : s + n], taps).to(h.dtype)
        out.append(y.reshape(1, N, -1, d))
    q, k, v = out
    z = la.in_proj_z(x)
    beta = la.in_proj_b(x).sigmoid()
    g = -la.A_log.float().exp() * F.softplus(la.in_proj_a(x).float() + la.dt_bias)
    return q, k, v, z, g, beta


def linear_out(layer: nn.Module, h: torch.Tensor, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The rest of a Gated DeltaNet layer: gated norm of the rule's output o (1, N, Hv, Dv), out_proj, MLP."""
    la = layer.linear_attn
    dv = la.head_v_dim
    o = _gated_norm(o.reshape(-1, dv), z.reshape(-1, dv), la.norm).reshape(h.shape[0], h.shape[1], -1)
    return _mlp(layer, h + la.out_proj(o))


def _flat_meta(doc_ids: torch.Tensor, K: int):
    """From doc_ids (B, T) (host preferred: no device sync): segment ids (1, B*T) unique per document and
    row, cu_seqlens (host, int64) and the conv taps (K-1, B*T) bool, all on the host."""
    B, T = doc_ids.shape
    start = doc_starts(doc_ids.cpu()).flatten()
    seg = start.long().cumsum(0)
    N = seg.numel()
    starts = torch.nonzero(start).flatten()
    cu = torch.cat([starts, starts.new_tensor([N])]).long()
    idx = torch.arange(N)
    taps = torch.stack([(idx >= j) & (seg == seg.roll(j)) for j in range(1, K)]) if K > 1 else None
    return seg.view(1, N), cu, taps


def _rule_fla(q, k, v, g, beta, cu, cu_cpu):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, _ = chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, use_qk_l2norm_in_kernel=True
    )
    return o


def _rule_torch(q, k, v, g, beta, batch: _Batch):
    rep = v.shape[2] // q.shape[2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return gated_delta_docs(q, k, v, g, beta, batch, "torch")


# -- one batch, two layouts ---------------------------------------------------------------------------------
@dataclass
class _Batch:
    """One call's tokens as a layout runs them, and the per-document metadata its layers read."""

    ids: torch.Tensor  # token ids: (B, T) by rows, (1, B*T) flattened
    doc: torch.Tensor  # the same shape, on the device: document ids (flattened: one per document and row)
    amask: object = None  # the attention metadata (``attention.attend``'s ``meta``)
    cu: torch.Tensor | None = None  # cu_seqlens over the flattened rows, on the device (fla; varlen)
    cu_cpu: torch.Tensor | None = None  # their host copy (flattened: fla reads it, no device sync)
    segments: list[tuple[int, int]] | None = None  # host (start, end) of each document (the torch rule)
    taps: torch.Tensor | None = None  # flattened: the conv taps (K-1, B*T) bool, on the device


class _Rows:
    """The rows as they are, every layer eager: the conv on (B, T) per document, the rule on the documents
    (q / k repeated to the value heads), transformers' own gated norm. The issue-14 path; the CPU default."""

    def batch(self, layers, input_ids, doc_ids, attn: str, linear: str) -> _Batch:
        dev = input_ids.device
        b = _Batch(input_ids, doc_ids.to(dev, non_blocking=True))
        if linear == "fla" or attn == "varlen":
            b.cu, max_len = varlen_meta(doc_ids, dev)
        if linear == "torch":
            b.segments = _segments(doc_ids)
        if attn == "varlen":
            b.amask = (b.cu, max_len)
        elif attn == "flex":
            b.amask = flex_mask(b.doc, None, dev)
        else:
            b.amask = dense_mask(b.doc, None)
        return b

    def linear_layer(self, layer: nn.Module, h, batch: _Batch, linear: str) -> torch.Tensor:
        x = layer.input_layernorm(h)
        return _mlp(layer, h + linear_mixer(layer.linear_attn, x, batch, linear))

    def attention_layer(self, layer: nn.Module, h, cos, sin, attn: str, batch: _Batch) -> torch.Tensor:
        return attn_step(layer, h, cos, sin, attn, batch.amask)


@dataclass(frozen=True)
class _Flat:
    """The rows flattened to one sequence of B*T tokens (every row start a document start), each layer as
    regions (compiled or not: one graph per region serves every layer and batch of that many tokens):
    ``lin_in`` (``linear_in``), the rule (fla on the key heads as they are, or plain PyTorch), ``lin_out``
    (``linear_out``); ``attn_step``. The fast path; the CUDA default. ``conv``: ``lin_in``'s conv, the name of
    one of ``doc_conv.KERNELS`` (None: ``_conv_silu``)."""

    lin_in: Callable
    lin_out: Callable
    attn_step: Callable
    conv: str | None = None

    def batch(self, layers, input_ids, doc_ids, attn: str, linear: str) -> _Batch:
        dev = input_ids.device
        B, T = input_ids.shape
        N = B * T
        lin = next((layer.linear_attn for layer in layers if _is_linear(layer)), None)
        K = lin.conv1d.weight.shape[-1] if lin is not None else 1
        seg, cu_cpu, taps = _flat_meta(doc_ids, K)
        seg_dev = seg.to(dev, non_blocking=True)
        cu = cu_cpu.to(dev, non_blocking=True)
        taps = taps.to(dev, non_blocking=True) if taps is not None else None
        segments = list(zip(cu_cpu[:-1].tolist(), cu_cpu[1:].tolist(), strict=True))
        if attn == "varlen":  # max length N, not the longest document: one compiled graph per token count
            amask = (cu.to(torch.int32), N)
        elif attn == "flex":
            amask = flex_mask(seg_dev, None, dev)
        else:
            amask = dense_mask(seg_dev, None)
        return _Batch(input_ids.reshape(1, N), seg_dev, amask, cu, cu_cpu, segments, taps)

    def linear_layer(self, layer: nn.Module, h, batch: _Batch, linear: str) -> torch.Tensor:
        q, k, v, z, g, beta = self.lin_in(layer, h, batch.taps, self.conv)
        if linear == "fla":  # the kernels index [1, N, heads, dim] as contiguous (no-op copies)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            o = _rule_fla(q, k, v, g.contiguous(), beta.contiguous(), batch.cu, batch.cu_cpu)
        else:
            o = _rule_torch(q, k, v, g, beta, batch)
        return self.lin_out(layer, h, o.to(v.dtype), z)

    def attention_layer(self, layer: nn.Module, h, cos, sin, attn: str, batch: _Batch) -> torch.Tensor:
        return self.attn_step(layer, h, cos, sin, attn, batch.amask)


# -- the capture --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class HybridCapture(Capture):
    """The per-document loop over a hybrid decoder's layers, in one of two layouts (``fast``: ``_Flat``, else
    ``_Rows``); ``linear``: the gated delta rule's backend (``"fla"`` / ``"torch"``)."""

    kind = "hybrid"
    attn: str
    linear: str
    fast: bool
    compiled: bool
    layout: _Rows | _Flat = field(repr=False)
    conv: str = "shifted taps"  # the fast path's conv: "triton rolling" / "triton tile" (doc_conv), or this

    def __call__(self, model, input_ids, doc_ids, target_layer_ids, need_final_hidden):
        base = decoder_of(model)
        layers = base.layers
        check_layer_ids(target_layer_ids, len(layers))
        lay, attn, linear = self.layout, self.attn, self.linear
        B, T = input_ids.shape
        last = len(layers) - 1 if need_final_hidden else max(target_layer_ids)
        with torch.no_grad():
            batch = lay.batch(layers, input_ids, doc_ids, attn, linear)
            h = base.embed_tokens(batch.ids)
            pos = doc_positions(batch.doc)
            cos, sin = base.rotary_emb(h, pos.unsqueeze(0).expand(3, *pos.shape))  # text: t = h = w positions
            out = torch.empty(
                *pos.shape, len(target_layer_ids) * h.shape[-1], dtype=h.dtype, device=input_ids.device
            )
            for i in range(last + 1):
                layer = layers[i]
                if _is_linear(layer):
                    h = lay.linear_layer(layer, h, batch, linear)
                else:
                    h = lay.attention_layer(layer, h, cos, sin, attn, batch)
                store_layer(out, h, i, target_layer_ids)
            final = base.norm(h).view(B, T, -1) if need_final_hidden else None
        return out.view(B, T, -1), final


# -- preparation ------------------------------------------------------------------------------------------------
def qualifies(model: nn.Module) -> bool:
    tc = text_config_of(model.config) if hasattr(model, "config") else None
    if tc is None or getattr(tc, "model_type", None) not in HYBRID_MODEL_TYPES:
        return False
    base = decoder_of(model)
    if not all(hasattr(base, n) for n in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    for layer in base.layers:
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return False
        if _is_linear(layer):
            la = layer.linear_attn
            names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias")
            extra = ("norm", "out_proj", "key_dim", "value_dim", "head_k_dim", "head_v_dim")
            if not all(hasattr(la, n) for n in (*names, *extra)):
                return False
        else:
            sa = getattr(layer, "self_attn", None)
            if sa is None or not all(
                hasattr(sa, n)
                for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "scaling")
            ):
                return False
    return True


def _conv_kernel(conv: str, model: nn.Module, device: torch.device) -> str | None:
    """The fast path's conv kernel (a name in ``doc_conv.KERNELS``), or None for ``_conv_silu``: asked for (or
    ``"auto"``), on CUDA, and the first that checks against ``_conv_silu`` on this device at the model's width."""
    if conv not in ("auto", "triton", "torch"):
        raise ValueError(f"conv must be 'auto', 'triton' or 'torch', got {conv!r}")
    if conv == "torch" or device.type != "cuda":
        return None
    lin = next((la for la in (getattr(x, "linear_attn", None) for x in decoder_of(model).layers) if la), None)
    return None if lin is None else doc_conv.select(device, _conv_silu, lin.conv1d.weight.shape[-1])


def preselect_conv(model: nn.Module) -> None:
    """Choose the fast path's conv kernel now, for ``prepare_hybrid`` to find (``doc_conv.select`` remembers it
    per device and width). Call it on the thread that compiles, before anything compiles beside it, as the
    model is built (``capture.begin_target``): the choice compiles a check, and torch's FX-tracing flag is
    process-wide, so a check compiled in the thread that reads the weights, beside the drafter's first-step
    compile, was refused ("using FX to symbolically trace a dynamo-optimized function", one H200, 2026-12-04)
    and the capture fell back to the slower kernel (the drafter's compile could as well have been refused)."""
    if qualifies(model):
        _conv_kernel("auto", model, next(model.parameters()).device)


def prepare_hybrid(
    model: nn.Module,
    attn: str = "auto",
    linear: str = "auto",
    fast: bool | None = None,
    compile: bool | None = None,
    conv: str = "auto",
) -> HybridCapture | None:
    """Switch ``capture`` to the per-document hybrid path and return it; None when the model does not qualify.

    ``linear``: ``"torch"`` (plain PyTorch; CPU) or ``"fla"`` (CUDA); ``"auto"`` = fla on CUDA (it must be
    installed: RuntimeError naming the package otherwise), torch on CPU. ``attn`` as in ``attention.attend``
    (``"auto"``: varlen when it works on this CUDA device, else flex; sdpa on CPU). ``fast`` (default: on
    CUDA): the flattened layout with compiled dense regions (module docstring); ``compile`` (default: on CUDA
    unless ``DFLASH_COMPILE=0``) compiles its three regions. ``conv`` (the fast path's per-document conv):
    ``"triton"`` (``doc_conv``'s kernel that ``doc_conv.select`` picks on this device, if any), ``"torch"`` (the
    shifted taps, ``_conv_silu``); ``"auto"`` = triton on CUDA where one checks."""
    if not qualifies(model):
        return None
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if linear == "auto":
        linear = "fla" if cuda else "torch"
    if linear == "fla" and not fla_available():
        raise RuntimeError(fla_missing_message())
    if attn == "auto":
        attn = ("varlen" if varlen_works(device) else "flex") if cuda else "sdpa"
    if fast is None:
        fast = cuda
    if compile is None:
        compile = cuda and compile_enabled()
    compile = bool(compile and fast)
    layout: _Rows | _Flat = _Rows()
    kernel = _conv_kernel(conv, model, device) if fast else None
    if fast:
        steps = (linear_in, linear_out, attn_step)
        if compile:
            steps = tuple(torch.compile(f, dynamic=None) for f in steps)
        layout = _Flat(*steps, conv=kernel)
    cap = HybridCapture(
        attn=attn,
        linear=linear,
        fast=bool(fast),
        compiled=compile,
        layout=layout,
        conv=f"triton {kernel}" if kernel else "shifted taps",
    )
    attach(model, cap)
    return cap
