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
  q/k norms) attend within each document through ``direct._attend`` (varlen / flex on CUDA, a dense
  document-causal mask on CPU).

Everything runs on the layers' own modules and weights (projections, norms, MLP / MoE block, the gated
output norm); no transformers mask building, cache or kernel routing is involved, so an installed fla
does not change the CPU path. ``prepare_hybrid(model)`` qualifies a model and picks the backends;
``capture_hybrid`` is called by ``capture.capture``.

The fast path (``prepare_hybrid(..., fast=True)``; the default on CUDA) runs the same computation on the
rows flattened to one sequence of ``B * T`` tokens (every row start is a document start), so that one
compiled graph serves every batch of that many tokens:

- ``linear_in`` (compiled): input norm, the input projections (q, k and v each by its row slice of
  ``in_proj_qkv``), the per-document conv as ``K`` shifted taps masked by "same document" (fp32 inside one
  fused kernel per tensor, contiguous bf16 out), SiLU, ``beta`` and the decay ``g``;
- the gated delta rule: flash-linear-attention's varlen ``chunk_gated_delta_rule`` with ``cu_seqlens`` (and
  its host copy: no device sync) on the 16 key heads as they are (the kernel's grouped-value form: each key
  head serves ``Hv / Hk`` consecutive value heads, as ``repeat_interleave`` does; nothing is repeated);
  plain PyTorch on CPU (there q/k are repeated);
- ``linear_out`` (compiled): the gated RMS norm, ``out_proj``, residual, post norm, MLP, residual;
- ``attn_step`` (compiled): a whole gated-attention layer (varlen attention inside, as ``direct`` does).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from trainer.drafting.compiling import compile_enabled
from trainer.drafting.config import text_config_of
from trainer.drafting.masks import doc_positions
from trainer.target.direct import _attend, _dense_mask, _doc_starts, _varlen_meta, _varlen_works, decoder_of

# model types whose packed rows this module captures correctly (text configs and multimodal wrappers)
HYBRID_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
FLA_PACKAGE = "flash-linear-attention"
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
    starts = torch.nonzero(_doc_starts(doc_ids.cpu()).flatten()).flatten().tolist()
    return list(zip(starts, [*starts[1:], B * T], strict=True))


def gated_delta_docs(q, k, v, g, beta, meta, backend: str) -> torch.Tensor:
    """Per-document gated delta rule over (B, T, ...) tensors; q/k (B, T, H, Dk) with H value heads."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    flat = [x.reshape(B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
    if backend == "fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        cu = meta["cu"]
        o, _ = chunk_gated_delta_rule(
            *(x.unsqueeze(0) for x in flat[:3]),
            flat[3].unsqueeze(0).float(),
            flat[4].unsqueeze(0),
            cu_seqlens=cu.long(),
            use_qk_l2norm_in_kernel=True,
        )
        return o.reshape(B, T, H, Dv).to(v.dtype)
    segs = meta["segments"]
    lmax = max(e - s for s, e in segs)
    padded = [
        torch.stack([F.pad(x[s:e], (0, 0) * (x.dim() - 1) + (0, lmax - (e - s))) for s, e in segs])
        for x in flat
    ]
    o = chunk_gated_delta(*padded)
    return torch.cat([o[i, : e - s] for i, (s, e) in enumerate(segs)]).reshape(B, T, H, Dv).to(v.dtype)


# -- the layers ------------------------------------------------------------------------------------------------
def linear_mixer(la: nn.Module, x: torch.Tensor, doc: torch.Tensor, meta, backend: str) -> torch.Tensor:
    """A Gated DeltaNet module's forward on x (B, T, H) with every document from zero state."""
    B, T, _ = x.shape
    dk, dv = la.head_k_dim, la.head_v_dim
    qkv = la.in_proj_qkv(x)
    z = la.in_proj_z(x).reshape(B, T, -1, dv)
    b = la.in_proj_b(x)
    a = la.in_proj_a(x)
    qkv = F.silu(causal_conv_docs(qkv, la.conv1d.weight.reshape(qkv.shape[-1], -1), la.conv1d.bias, doc))
    qkv = qkv.to(x.dtype)
    q, k, v = torch.split(qkv, [la.key_dim, la.key_dim, la.value_dim], dim=-1)
    q, k, v = q.reshape(B, T, -1, dk), k.reshape(B, T, -1, dk), v.reshape(B, T, -1, dv)
    rep = v.shape[2] // q.shape[2]
    if rep > 1:  # each key head serves `rep` consecutive value heads
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    beta = b.sigmoid()
    g = -la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias)
    o = gated_delta_docs(q, k, v, g, beta, meta, backend)
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
    o = _attend(q, k, v, sa.scaling, None, attn, meta).reshape(B, T, -1)
    return sa.o_proj(o * torch.sigmoid(gate))


def _is_linear(layer: nn.Module) -> bool:
    return getattr(layer, "linear_attn", None) is not None


# -- preparation and capture --------------------------------------------------------------------------------
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


def prepare_hybrid(
    model: nn.Module,
    attn: str = "auto",
    linear: str = "auto",
    fast: bool | None = None,
    compile: bool | None = None,
) -> dict | None:
    """Switch ``capture`` to the per-document hybrid path; None when the model does not qualify.

    ``linear``: ``"torch"`` (plain PyTorch; CPU) or ``"fla"`` (CUDA); ``"auto"`` = fla on CUDA (it must be
    installed: RuntimeError naming the package otherwise), torch on CPU. ``attn`` as in ``direct``
    (``"auto"``: varlen when it works on this CUDA device, else flex; sdpa on CPU). ``fast`` (default: on
    CUDA): the flattened path with compiled dense regions (module docstring); ``compile`` (default: on CUDA
    unless ``DFLASH_COMPILE=0``) compiles its three regions."""
    if not qualifies(model):
        return None
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if linear == "auto":
        linear = "fla" if cuda else "torch"
    if linear == "fla" and not fla_available():
        raise RuntimeError(fla_missing_message())
    if attn == "auto":
        attn = ("varlen" if _varlen_works(device) else "flex") if cuda else "sdpa"
    if fast is None:
        fast = cuda
    if compile is None:
        compile = cuda and compile_enabled()
    compile = bool(compile and fast)
    st = {"kind": "hybrid", "attn": attn, "linear": linear, "fast": bool(fast), "compiled": compile}
    if fast:
        wrap = (lambda f: torch.compile(f, dynamic=None)) if compile else (lambda f: f)
        st["steps"] = (wrap(linear_in), wrap(linear_out), wrap(attn_step))
    model._dflash_capture = st
    return st


def capture_hybrid(model, base, input_ids, doc_ids, target_layer_ids, need_final_hidden):
    st = model._dflash_capture
    layers = base.layers
    if any(not 0 <= i < len(layers) for i in target_layer_ids):
        raise ValueError(f"target_layer_ids {target_layer_ids} out of range for {len(layers)} loaded layers")
    if st.get("fast"):
        return capture_hybrid_fast(model, base, input_ids, doc_ids, target_layer_ids, need_final_hidden)
    dev = input_ids.device
    attn, backend = st["attn"], st["linear"]
    B, T = input_ids.shape
    last = len(layers) - 1 if need_final_hidden else max(target_layer_ids)
    with torch.no_grad():
        doc = doc_ids.to(dev, non_blocking=True)
        meta = {}
        if backend == "fla" or attn == "varlen":
            cu, max_len = _varlen_meta(doc_ids, dev)
            meta["cu"] = cu
        if backend == "torch":
            meta["segments"] = _segments(doc_ids)
        if attn == "varlen":
            amask = (cu, max_len)
        elif attn == "flex":
            from trainer.target.direct import _flex_mask

            amask = _flex_mask(doc, None, dev)
        else:
            amask = _dense_mask(doc, None)
        h = base.embed_tokens(input_ids)
        pos = doc_positions(doc)
        cos, sin = base.rotary_emb(h, pos.unsqueeze(0).expand(3, B, T))  # text: t = h = w positions
        H = h.shape[-1]
        out = torch.empty(B, T, len(target_layer_ids) * H, dtype=h.dtype, device=dev)
        for i in range(last + 1):
            layer = layers[i]
            x = layer.input_layernorm(h)
            if _is_linear(layer):
                h = h + linear_mixer(layer.linear_attn, x, doc, meta, backend)
            else:
                h = h + attention_mixer(layer.self_attn, x, cos, sin, attn, amask)
            m = layer.mlp(layer.post_attention_layernorm(h))
            if isinstance(m, tuple):
                m = m[0]
            h = h + m
            for slot, li in enumerate(target_layer_ids):
                if li == i:
                    out[..., slot * H : (slot + 1) * H] = h
        final = base.norm(h) if need_final_hidden else None
    return out, final


# -- the fast path: flattened rows, compiled dense regions ----------------------------------------------------
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


def linear_in(layer: nn.Module, h: torch.Tensor, taps: torch.Tensor):
    """h (1, N, H) -> q, k (1, N, Hk, Dk), v (1, N, Hv, Dv) after conv + SiLU; z (1, N, Hv*Dv); g, beta.

    q, k and v are projected by three row slices of ``in_proj_qkv`` (no copy) and convolved separately:
    each comes out contiguous from one fused kernel, where one projection then a split would need the
    convolved whole materialised and copied again (measured: 2.9 ms per layer on the H200 at 49,152 tokens)."""
    la = layer.linear_attn
    N = h.shape[1]
    x = layer.input_layernorm(h)
    W, b = la.in_proj_qkv.weight, la.in_proj_qkv.bias
    cw = la.conv1d.weight.reshape(W.shape[0], -1)
    cb = la.conv1d.bias
    out = []
    s = 0
    for n, d in ((la.key_dim, la.head_k_dim), (la.key_dim, la.head_k_dim), (la.value_dim, la.head_v_dim)):
        y = F.linear(x, W[s : s + n], None if b is None else b[s : s + n])
        y = _conv_silu(y, cw[s : s + n], None if cb is None else cb[s : s + n], taps).to(h.dtype)
        out.append(y.reshape(1, N, -1, d))
        s += n
    q, k, v = out
    z = la.in_proj_z(x)
    beta = la.in_proj_b(x).sigmoid()
    g = -la.A_log.float().exp() * F.softplus(la.in_proj_a(x).float() + la.dt_bias)
    return q, k, v, z, g, beta


def _mlp(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    m = layer.mlp(layer.post_attention_layernorm(h))
    if isinstance(m, tuple):
        m = m[0]
    return h + m


def linear_out(layer: nn.Module, h: torch.Tensor, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The rest of a Gated DeltaNet layer: gated norm of the rule's output o (1, N, Hv, Dv), out_proj, MLP."""
    la = layer.linear_attn
    dv = la.head_v_dim
    o = _gated_norm(o.reshape(-1, dv), z.reshape(-1, dv), la.norm).reshape(h.shape[0], h.shape[1], -1)
    return _mlp(layer, h + la.out_proj(o))


def attn_step(layer: nn.Module, h: torch.Tensor, cos, sin, attn: str, meta) -> torch.Tensor:
    """A whole gated-attention layer on h (1, N, H), attention within each document."""
    x = layer.input_layernorm(h)
    return _mlp(layer, h + attention_mixer(layer.self_attn, x, cos, sin, attn, meta))


def _flat_meta(doc_ids: torch.Tensor, K: int):
    """From doc_ids (B, T) (host preferred: no device sync): segment ids (1, B*T) unique per document and
    row, cu_seqlens (host, int64) and the conv taps (K-1, B*T) bool, all on the host."""
    B, T = doc_ids.shape
    start = _doc_starts(doc_ids.cpu()).flatten()
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


def _rule_torch(q, k, v, g, beta, segments):
    rep = v.shape[2] // q.shape[2]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return gated_delta_docs(q, k, v, g, beta, {"segments": segments}, "torch")


def capture_hybrid_fast(model, base, input_ids, doc_ids, target_layer_ids, need_final_hidden):
    st = model._dflash_capture
    lin_in, lin_out, att = st["steps"]
    layers = base.layers
    dev = input_ids.device
    attn, backend = st["attn"], st["linear"]
    B, T = input_ids.shape
    N = B * T
    last = len(layers) - 1 if need_final_hidden else max(target_layer_ids)
    lin = next((layer.linear_attn for layer in layers if _is_linear(layer)), None)
    K = lin.conv1d.weight.shape[-1] if lin is not None else 1
    with torch.no_grad():
        seg, cu_cpu, taps = _flat_meta(doc_ids, K)
        seg_dev = seg.to(dev, non_blocking=True)
        cu = cu_cpu.to(dev, non_blocking=True)
        taps = taps.to(dev, non_blocking=True) if taps is not None else None
        segments = list(zip(cu_cpu[:-1].tolist(), cu_cpu[1:].tolist(), strict=True))
        if attn == "varlen":  # max length N, not the longest document: one compiled graph per token count
            amask = (cu.to(torch.int32), N)
        elif attn == "flex":
            from trainer.target.direct import _flex_mask

            amask = _flex_mask(seg_dev, None, dev)
        else:
            amask = _dense_mask(seg_dev, None)
        h = base.embed_tokens(input_ids.reshape(1, N))
        pos = doc_positions(seg_dev)
        cos, sin = base.rotary_emb(h, pos.unsqueeze(0).expand(3, 1, N))  # text: t = h = w positions
        H = h.shape[-1]
        out = torch.empty(1, N, len(target_layer_ids) * H, dtype=h.dtype, device=dev)
        for i in range(last + 1):
            layer = layers[i]
            if _is_linear(layer):
                q, k, v, z, g, beta = lin_in(layer, h, taps)
                if backend == "fla":  # the kernels index [1, N, heads, dim] as contiguous (no-op copies)
                    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                    o = _rule_fla(q, k, v, g.contiguous(), beta.contiguous(), cu, cu_cpu)
                else:
                    o = _rule_torch(q, k, v, g, beta, segments)
                h = lin_out(layer, h, o.to(v.dtype), z)
            else:
                h = att(layer, h, cos, sin, attn, amask)
            for slot, li in enumerate(target_layer_ids):
                if li == i:
                    out[..., slot * H : (slot + 1) * H] = h
        final = base.norm(h).view(B, T, H) if need_final_hidden else None
    return out.view(B, T, -1), final
