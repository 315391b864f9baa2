"""DFlashDrafter: the DFlash block-diffusion drafter (Qwen3-style layers fed with target hidden states).

``DFlashDrafter(cfg)`` has ``fc`` (``num_captured * hidden -> hidden``, no bias), ``hidden_norm``,
``layers`` (``cfg.num_draft_layers`` Qwen3 decoder layers: RMSNorm, GQA attention with ``q_norm``/``k_norm``,
RoPE, SwiGLU) and a final ``norm``; parameter names follow the published checkpoints (z-lab / vLLM /
SGLang), so ``state_dict()`` is what ``save_drafter`` (below) writes. It owns no embedding and no lm_head:
the caller passes the target's frozen ``embed_tokens`` (``drafting.head.FrozenHead``).

``forward(target_hidden (B,T,n*H), input_ids (B,T), doc_ids (B,T), anchors (B,A), embed_tokens,
attn_impl='sdpa'|'flex') -> (B, A, block_size, H)`` normed draft hidden states (logits = lm_head of them).

- Context: ``hidden_norm(fc(target_hidden))``, fed to every layer as extra keys/values through that layer's
  own ``k_proj``/``v_proj`` (+ ``k_norm``), at the context positions. Queries come from the blocks only.
- Blocks: ``[input_ids[a], mask, mask, ...]`` embedded by ``embed_tokens``; a padding block (``a == -1``)
  is all mask tokens at positions 0..block_size-1 and its output is meaningless but finite.
- Positions restart at 0 at every document of a packed row (``drafting.masks.doc_positions``): the same positions
  the target saw when each document was run alone, and what inference uses (one sequence from 0). Slot k
  of a block is at ``pos[a] + k``.
- Attention mask: ``trainer.drafting.masks`` (the rule is documented there). ``attn_impl='sdpa'`` uses a dense bool
  mask (CPU training; FlexAttention has no CPU backward); ``'flex'`` uses a FlexAttention BlockMask
  (compiled ``flex_attention`` on CUDA, eager elsewhere).
- ``gradient_checkpointing`` (attribute, default False) recomputes each layer in backward.
- ``compile_layers`` (attribute, default True): with ``attn_impl='flex'`` on CUDA each decoder layer runs
  through one ``torch.compile``d step shared by all layers (fused norms/RoPE/SwiGLU; flex_attention runs
  outside that graph, compiled on its own, so each batch's BlockMask is an input, never a traced constant);
  ``DFLASH_COMPILE=0`` in the environment turns it off.

DFlash 2 (``cfg.arch == "dflash2"``, docs/model.md): every layer also has ``attention_conv`` and ``mlp_conv``
(``drafting.dflash2_conv.GroupedDynamicConv``, wrapped around the attention and the MLP by ``attn_block`` /
``mlp_block``) and the drafter a ``candidate_selector`` (``drafting.selector.CandidateSelector``), which the
forward does not use: its loss (``drafting.selector.selector_loss``) and the evaluation's walk do.

The published file format (the layout of the z-lab drafters; loaded by vLLM and SGLang).

``save_drafter(drafter, cfg, out_dir)`` writes
- ``config.json`` (``drafting.export_config``): a Qwen3 config (``model_type: qwen3``,
  ``architectures: ["DFlashDraftModel"]``, the sizes, ``num_hidden_layers`` = draft layers, ``layer_types``,
  ``sliding_window``/``use_sliding_window``, ``is_causal: false``, ``rope_theta``/``rope_scaling`` plus
  transformers-5 ``rope_parameters``, ``tie_word_embeddings: false``) with the DFlash fields ``block_size``,
  ``num_target_layers`` and ``dflash_config: {block_size, mask_token_id, target_layer_ids}`` (``causal: false``
  too when a layer slides); ``python -m trainer.export --check`` checks it against each server's rules;
- ``model.safetensors``: the drafter's ``state_dict()`` (``fc.weight``, ``hidden_norm.weight``,
  ``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``...q_norm/k_norm``, ``layers.N.mlp.{gate,up,down}_proj``,
  ``layers.N.{input,post_attention}_layernorm``, ``norm.weight``): no embedding, no lm_head (the server takes
  them from the target).
DFlash 2: ``architectures: ["DFlash2DraftModel"]``, ``dflash_config`` also holds ``conv_kernel_size``,
``conv_group_size``, ``selector_rank``, ``selector_top_k``; the weights add ``layers.N.{attention,mlp}_conv.
{base_kernel, kernel_projection.weight}`` and ``candidate_selector.{predecessor_codebook, successor_codebook,
hidden_projection.weight}`` (vLLM ``qwen3_dflash2.py``'s names).
``load_drafter(out_dir, device="cpu") -> (drafter, cfg)`` reads both back bit-exactly (same dtype).
A DDP (``.module``) or ``torch.compile`` (``._orig_mod``) wrapper is unwrapped before saving.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.drafting import masks
from trainer.drafting.compiling import compile_enabled
from trainer.drafting.config import DFLASH2_FIELDS, DraftConfig
from trainer.drafting.dflash2_conv import GroupedDynamicConv
from trainer.drafting.export_config import config_dict
from trainer.drafting.flex import flex_attention
from trainer.drafting.norm import RMSNorm
from trainer.drafting.rope import apply_rope, rope_cos_sin, rope_inv_freq
from trainer.drafting.selector import CandidateSelector


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig, layer_idx: int):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.sliding_window = cfg.window_of(layer_idx)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, n, self.head_dim)

    def forward(self, x, ctx, rope_q, rope_ctx, attn_mask, attn_impl: str):
        B, Q, _ = x.shape
        q = self.q_norm(self._heads(self.q_proj(x), self.n_heads)).transpose(1, 2)
        k_blk = self.k_norm(self._heads(self.k_proj(x), self.n_kv)).transpose(1, 2)
        k_ctx = self.k_norm(self._heads(self.k_proj(ctx), self.n_kv)).transpose(1, 2)
        v_blk = self._heads(self.v_proj(x), self.n_kv).transpose(1, 2)
        v_ctx = self._heads(self.v_proj(ctx), self.n_kv).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = torch.cat([apply_rope(k_ctx, *rope_ctx), apply_rope(k_blk, *rope_q)], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        # under autocast the projections come out in the low dtype and the norms/RoPE in the weights' one:
        # attention kernels (flex in particular) want one dtype
        q, k = q.to(v.dtype), k.to(v.dtype)
        scale = 1.0 / math.sqrt(self.head_dim)
        if attn_impl == "flex":
            out = flex_attention(q, k, v, attn_mask, scale)
        else:
            if self.n_kv != self.n_heads:  # explicit GQA expansion: works on every torch/backend
                rep = self.n_heads // self.n_kv
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.n_heads * self.head_dim))


_COMPILED_LAYER = None


def _run_layer(layer, x, ctx, rope_q, rope_ctx, attn_mask, attn_impl):
    return layer(x, ctx, rope_q, rope_ctx, attn_mask, attn_impl)


def _compiled_layer():
    """One compiled decoder-layer step shared by all layers (regional compilation: weights are inputs)."""
    global _COMPILED_LAYER
    if _COMPILED_LAYER is None:
        _COMPILED_LAYER = torch.compile(_run_layer)
    return _COMPILED_LAYER


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.arch == "dflash2":  # DFlash 2: a grouped dynamic causal conv around both sublayers
            conv = (cfg.hidden_size, cfg.block_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.attention_conv = GroupedDynamicConv(*conv)
            self.mlp_conv = GroupedDynamicConv(*conv)

    def attn_block(self, h, attn):
        """``attn(normed input) -> output``, wrapped in the DFlash 2 convolutions when there are some."""
        conv = getattr(self, "attention_conv", None)
        if conv is None:
            return attn(h)
        h, delta = conv.prepare(h)
        return conv.finish(attn(h), delta)

    def mlp_block(self, h):
        conv = getattr(self, "mlp_conv", None)
        if conv is None:
            return self.mlp(h)
        h, delta = conv.prepare(h)
        return conv.finish(self.mlp(h), delta)

    def forward(self, x, ctx, rope_q, rope_ctx, attn_mask, attn_impl: str):
        x = x + self.attn_block(
            self.input_layernorm(x), lambda h: self.self_attn(h, ctx, rope_q, rope_ctx, attn_mask, attn_impl)
        )
        return x + self.mlp_block(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_captured * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_draft_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.arch == "dflash2":
            self.candidate_selector = CandidateSelector(
                cfg.vocab_size, cfg.hidden_size, cfg.selector_rank, cfg.selector_top_k
            )
        # kept outside the module's buffers so .to(dtype) never rounds it; made on the CPU whatever device
        # the module is built on (meta in load_drafter) and moved to the positions' device at first use
        self._inv_freq, self.rope_scale = rope_inv_freq(cfg, device="cpu")
        self.gradient_checkpointing = False
        self.compile_layers = True
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Reference-style init: linear weights N(0, std), biases 0, norms 1."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        for m in self.modules():  # after the loop above: their projections are Linear layers too
            if isinstance(m, (GroupedDynamicConv, CandidateSelector)):
                m.reset_parameters()

    def _rope(self, pos: torch.Tensor, dtype: torch.dtype):
        if self._inv_freq.device != pos.device:
            self._inv_freq = self._inv_freq.to(pos.device)
        return rope_cos_sin(pos, self._inv_freq, self.rope_scale, dtype)

    def forward(
        self,
        target_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor,
        anchors: torch.Tensor,
        embed_tokens: nn.Module,
        attn_impl: str = "sdpa",
    ) -> torch.Tensor:
        cfg = self.cfg
        bs = cfg.block_size
        if attn_impl not in ("sdpa", "flex"):
            raise ValueError(f"attn_impl must be 'sdpa' or 'flex', got {attn_impl!r}")
        B, T = input_ids.shape
        if target_hidden.shape[:2] != (B, T) or target_hidden.shape[-1] != cfg.num_captured * cfg.hidden_size:
            raise ValueError(
                f"target_hidden has shape {tuple(target_hidden.shape)}, expected ({B}, {T}, "
                f"{cfg.num_captured * cfg.hidden_size}) = num_captured * hidden_size"
            )
        if doc_ids.shape != (B, T) or anchors.dim() != 2 or anchors.shape[0] != B:
            raise ValueError(
                f"doc_ids {tuple(doc_ids.shape)} must be (B, T) = ({B}, {T}) and anchors {tuple(anchors.shape)} (B, A)"
            )
        A = anchors.shape[1]
        dtype = self.fc.weight.dtype
        anchors = anchors.long()
        valid = anchors >= 0
        a0 = anchors.clamp(min=0)

        # block tokens and positions
        ids = torch.full((B, A, bs), cfg.mask_token_id, dtype=torch.long, device=input_ids.device)
        ids[:, :, 0] = torch.where(valid, torch.gather(input_ids, 1, a0), ids[:, :, 0])
        x = embed_tokens(ids.view(B, A * bs)).to(dtype)
        pos_ctx = masks.doc_positions(doc_ids)
        base = torch.where(valid, torch.gather(pos_ctx, 1, a0), torch.zeros_like(a0))
        pos_q = (base.unsqueeze(-1) + torch.arange(bs, device=base.device)).view(B, A * bs)
        rope_q = self._rope(pos_q, dtype)
        rope_ctx = self._rope(pos_ctx, dtype)

        ctx = self.hidden_norm(self.fc(target_hidden.to(dtype)))

        # one mask per distinct window among the layers
        build = masks.flex_block_mask if attn_impl == "flex" else masks.dense_mask
        mask_by_window = {
            w: build(anchors, doc_ids, bs, w) for w in {cfg.window_of(i) for i in range(len(self.layers))}
        }

        compiled = attn_impl == "flex" and x.is_cuda and self.compile_layers and compile_enabled()
        run = _compiled_layer() if compiled else _run_layer
        for i, layer in enumerate(self.layers):
            m = mask_by_window[cfg.window_of(i)]
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(run, layer, x, ctx, rope_q, rope_ctx, m, attn_impl, use_reentrant=False)
            else:
                x = run(layer, x, ctx, rope_q, rope_ctx, m, attn_impl)
        return self.norm(x).view(B, A, bs, cfg.hidden_size)


# -- the published file format ---------------------------------------------------------------------
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def config_json(cfg: DraftConfig, dtype: torch.dtype = torch.bfloat16) -> dict:
    """config.json of the export (``drafting.export_config``: the keys each server reads)."""
    return config_dict(cfg, _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")))


def config_from_json(d: dict) -> DraftConfig:
    """The DraftConfig of a drafter's config.json; ``ValueError`` (``ConfigError`` among them) when it cannot be
    one: a number too large for an integer (``1e999``) too, never an ``OverflowError``."""
    try:
        return _config_from_json(d)
    except OverflowError as e:
        raise ValueError(f"drafter config.json: a size is not a finite integer ({e})") from None


def _config_from_json(d: dict) -> DraftConfig:
    dflash = d.get("dflash_config") or {}
    block_size = d.get("block_size", dflash.get("block_size"))
    for name, value in (
        ("block_size", block_size),
        ("dflash_config.mask_token_id", dflash.get("mask_token_id")),
        ("dflash_config.target_layer_ids", dflash.get("target_layer_ids")),
    ):
        if value is None:
            raise ValueError(f"drafter config.json has no {name}")
    if dflash.get("context_back"):  # the removed --context-back experiment (lab/context_back/): fc reads more
        raise ValueError(
            f"drafter config.json has dflash_config.context_back={dflash['context_back']!r}: the trainer no longer "
            "builds that experiment's drafter (its fc reads the positions before each one; lab/context_back/)"
        )
    n = int(d["num_hidden_layers"])
    arch = "dflash2" if "DFlash2DraftModel" in (d.get("architectures") or []) else "dflash"
    if arch == "dflash2":
        missing = [f for f in DFLASH2_FIELDS if dflash.get(f) is None]
        if missing:
            raise ValueError(f"DFlash2DraftModel config.json has no dflash_config.{', '.join(missing)}")
    return DraftConfig(
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_attention_heads=int(d["num_attention_heads"]),
        num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
        head_dim=int(d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]),
        vocab_size=int(d["vocab_size"]),
        num_target_layers=int(d["num_target_layers"]),
        target_layer_ids=[int(i) for i in dflash["target_layer_ids"]],
        mask_token_id=int(dflash["mask_token_id"]),
        num_draft_layers=n,
        block_size=int(block_size),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        rope_scaling=d.get("rope_scaling") or None,
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        layer_types=list(
            d.get("layer_types") or []
        ),  # none: all full_attention (DraftConfig, once n is checked)
        sliding_window=d.get("sliding_window"),
        attention_bias=bool(d.get("attention_bias", False)),
        arch=arch,
        **{f: (int(dflash[f]) if arch == "dflash2" else None) for f in DFLASH2_FIELDS},
    )


def save_drafter(
    drafter: DFlashDrafter, cfg: DraftConfig, out_dir: str | os.PathLike, dtype: torch.dtype | None = None
) -> None:
    """Write the published layout; ``dtype`` casts the weights (None: the drafter's own). Files are 0644: a
    server running as another user reads them."""
    from safetensors.torch import save_file

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    for attr in ("module", "_orig_mod"):  # DDP / torch.compile wrappers
        drafter = getattr(drafter, attr, drafter)
    dtype = dtype or drafter.fc.weight.dtype
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    weights, config = os.path.join(out_dir, "model.safetensors"), os.path.join(out_dir, "config.json")
    save_file(state, weights, metadata={"format": "pt"})
    with open(config, "w") as f:
        json.dump(config_json(cfg, dtype), f, indent=2)
        f.write("\n")
    for p in (weights, config):
        os.chmod(p, 0o644)


def load_drafter(
    out_dir: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[DFlashDrafter, DraftConfig]:
    from safetensors.torch import load_file

    out_dir = os.fspath(out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = config_from_json(json.load(f))
    state = load_file(os.path.join(out_dir, "model.safetensors"), device=str(device))
    with torch.device("meta"):  # no initialisation: every parameter comes from the file (strict)
        drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(state, strict=True, assign=True)
    return drafter.to(device=device, dtype=state["fc.weight"].dtype), cfg
