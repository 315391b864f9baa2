"""The frozen target model: loading, and the capture forward that produces the drafter's context features.

- ``load_target(path, device, dtype, target_layer_ids, need_final_hidden=False)``:
  ``AutoModelForCausalLM.from_pretrained(path)`` (a local directory; nothing is downloaded), frozen, eval.
  Without ``need_final_hidden`` the config is cut to ``max(target_layer_ids) + 1`` decoder layers before
  loading, so the later layers are neither loaded nor run (the final norm and lm_head still load: the capture
  does not use them, but in one process the drafter's frozen head shares them: runtime/shared_head.py).
  ``target_dtype`` (``--target-dtype``): FP8 projections from an FP8 checkpoint (its default) or a bf16 one
  quantised on load, or an FP8 checkpoint dequantised (``loading.py``, ``fp8.py``); ``fp8_scales``
  (``--fp8-scales``): their scales, "block" (None: 128 x 128, as the checkpoint) or "row" (``fp8_rows.py``).
- ``begin_target(...)`` then ``PendingTarget.finish(progress)``: ``load_target`` in two halves, the build on
  the calling thread and the reading of the weights in any (the trainer reads beside the drafter's compile;
  ``loading.BuiltModel`` says why the build must not run beside a compile).
- ``capture(model, input_ids, doc_ids, target_layer_ids, need_final_hidden=False)
  -> (hidden_cat (B, T, n*H), final_hidden (B, T, H) or None)``: runs the base decoder (``model.model``,
  never the LM head) under ``torch.no_grad``, takes the output of decoder layer ``i`` for each ``i`` in
  ``target_layer_ids`` (= ``hidden_states[i + 1]`` in transformers' numbering, the reference's reading)
  with forward hooks, and stops right after the last captured layer unless ``need_final_hidden``.
  ``final_hidden`` is the base model's ``last_hidden_state`` (after the final norm).
- Packed rows: documents must not see each other. ``capture`` passes per-document ``position_ids``
  (restarting at 0 where ``doc_ids`` changes, ``masks.doc_positions``) and no ``attention_mask``;
  transformers then detects the packed format and builds a block-diagonal causal mask (sdpa / eager /
  flex) or uses varlen kernels (flash-attention). Rows are assumed right-padded with their own doc id
  (e.g. -1) for the padding. Linear-attention layers do not reset their state at such boundaries in
  transformers: the hook path refuses (ValueError) a row of several documents for a target with
  linear-attention layers (Qwen3-Next: one document per row, also refused up front by the flags).
- Hybrid linear-attention targets (Qwen3.5 / Qwen3.6, ``run.families.HYBRID_MODEL_TYPES``): ``load_target``
  loads the text model only (``loading.load_text_model``: no vision tower, no MTP head, no layer past the
  last one needed) and switches ``capture`` to ``hybrid.HybridCapture`` on every device: each document of a
  packed row starts from zero conv and recurrent state (plain PyTorch on CPU; flash-linear-attention's
  varlen kernels on CUDA, a RuntimeError naming the package when it is missing). On CUDA it takes the fast
  layout (``hybrid.prepare_hybrid(fast=True)``: flattened rows, compiled regions; see hybrid.py).
- ``prepare_capture(model, attn="auto", compile=None)``: switches ``capture`` to the direct path for
  pre-norm Qwen3 / Qwen2 / Llama / Mistral decoders (``DIRECT_MODEL_TYPES``): our own loop over
  ``layers[:last + 1]`` using the layers' weights (no hooks, no transformers mask building), attention
  per document through ``attn`` = ``"varlen"`` (torch's flash varlen kernel, causal within each
  document), ``"flex"`` (FlexAttention, document-causal BlockMask), ``"sdpa"`` (dense document-causal
  mask; CPU) or ``"sdpa_causal"`` (plain causal: ONLY for rows that are one document each, not checked);
  ``"auto"`` = varlen when torch has it on CUDA, else flex on CUDA, else sdpa. ``compile`` (default: on
  CUDA) compiles one decoder layer's step (regional compilation, shared by all layers). Returns the
  chosen mode, or None when the model does not qualify (``capture`` then keeps the hook path).
  ``load_target`` calls it on CUDA. The varlen path needs the document boundaries on the host: pass
  ``doc_ids`` on the CPU to avoid the one device sync per ``capture`` call that reading them costs.
- The dispatch: each path is a ``base.Capture`` (``HookCapture`` here, ``direct.DirectCapture``,
  ``hybrid.HybridCapture``), chosen once by ``load_target`` / ``prepare_capture`` / ``prepare_hybrid`` and
  held by the model (``model._dflash_capture``; None there = the hook path). ``capture_of(model)`` returns
  it, ``capture`` calls it. Its settings are fields (``capture_of(model).compiled``, ``.attn``) and ``record()`` gives them as a dict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from trainer.drafting.config import text_config_of
from trainer.drafting.masks import doc_positions
from trainer.run.families import HYBRID_MODEL_TYPES
from trainer.run.fp8_config import read_dir
from trainer.target.base import ATTR, Capture, check_layer_ids, decoder_of
from trainer.target.direct import DIRECT_MODEL_TYPES, prepare_capture
from trainer.target.hybrid import prepare_hybrid, preselect_conv

__all__ = [
    "DIRECT_MODEL_TYPES",
    "HYBRID_MODEL_TYPES",
    "Capture",
    "capture",
    "capture_of",
    "decoder_of",
    "PendingTarget",
    "begin_target",
    "load_target",
    "prepare_capture",
    "prepare_hybrid",
]


class _StopForward(Exception):
    pass


def _has_safetensors(path: str) -> bool:
    return any(
        os.path.exists(os.path.join(path, f)) for f in ("model.safetensors", "model.safetensors.index.json")
    )


def load_target(
    path: str,
    device: str | torch.device,
    dtype: torch.dtype,
    target_layer_ids: list[int],
    need_final_hidden: bool = False,
    attn_implementation: str | None = None,
    progress=None,
    target_dtype: str | None = None,
    fp8_scales: str | None = None,
) -> nn.Module:
    """``progress(bytes_done, bytes_total)`` (optional) is called as the weights are read: per tensor on the
    text-only path, once at the end (the weight files' size) on the ``from_pretrained`` path.
    ``target_dtype``: ``--target-dtype`` (bf16 / fp8; None: fp8 for an FP8 checkpoint), ``loading.py``;
    ``fp8_scales``: ``--fp8-scales`` (block / row; None: block)."""
    pending = begin_target(
        path,
        device,
        dtype,
        target_layer_ids,
        need_final_hidden,
        attn_implementation,
        target_dtype,
        fp8_scales,
    )
    return pending.finish(progress)


@dataclass
class PendingTarget:
    """A target built by ``begin_target`` (on the calling thread) whose weights ``finish`` reads (in any
    thread: ``loading.BuiltModel`` says why the two are apart)."""

    path: str
    device: str | torch.device
    model_type: str | None
    built: object = None  # loading.BuiltModel (safetensors, text-only) or None
    model: nn.Module | None = None  # from_pretrained's model, read already

    def finish(self, progress=None) -> nn.Module:
        if self.built is not None:
            model = self.built.fill(progress)
        else:
            model = self.model
            if progress is not None:
                from trainer.target.loading import weight_files_bytes

                total = weight_files_bytes(self.path)
                progress(total, total)
        model.eval()
        model.requires_grad_(False)
        if self.model_type in HYBRID_MODEL_TYPES:
            if prepare_hybrid(model) is None:
                raise ValueError(
                    f"{self.path}: a {self.model_type} target whose layers this trainer does not recognise "
                    "(transformers version?): its packed rows cannot be captured per document"
                )
        elif str(self.device).startswith("cuda"):
            prepare_capture(model)
        return model


def begin_target(
    path: str,
    device: str | torch.device,
    dtype: torch.dtype,
    target_layer_ids: list[int],
    need_final_hidden: bool = False,
    attn_implementation: str | None = None,
    target_dtype: str | None = None,
    fp8_scales: str | None = None,
) -> PendingTarget:
    """``load_target``'s first half: the config checked and cut to the layers captured, the model built
    (safetensors: allocated on ``device``, nothing read; other formats: transformers' own loader, whole)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    tc = text_config_of(config)
    _cut_layers(tc, target_layer_ids, need_final_hidden)
    model_type = getattr(tc, "model_type", None)
    if model_type in HYBRID_MODEL_TYPES or (attn_implementation is None and _has_safetensors(path)):
        # built on the device without initialising, every tensor then read straight from the memory-mapped
        # files (with byte progress): no copy of the whole model staged in host memory first, as
        # from_pretrained then .to(device) does (issue 22: 36 s of a 69 s start at the 8B shape)
        from trainer.target.loading import build_text_model

        built = build_text_model(path, tc, device, dtype, target_dtype, fp8_scales)
        if model_type in HYBRID_MODEL_TYPES:
            preselect_conv(built.model)  # here, not in finish's thread (hybrid.preselect_conv)
        return PendingTarget(path, device, model_type, built=built)
    # other weight formats, or an attention implementation asked for: transformers' own loader
    if target_dtype == "fp8" or fp8_scales is not None or read_dir(path) is not None:
        raise ValueError(f"{path}: an FP8 target is read by this trainer's loader (safetensors weights)")
    kwargs = {"config": config, "dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.to(device)
    return PendingTarget(path, device, model_type, model=model)


def _cut_layers(tc, target_layer_ids: list[int], need_final_hidden: bool) -> None:
    """Check the layer ids; without the final hidden state, build no layer past the last one captured."""
    n_layers = int(tc.num_hidden_layers)
    bad = [i for i in target_layer_ids if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"target_layer_ids {bad} out of range for a target with {n_layers} layers")
    if not need_final_hidden:
        keep = max(target_layer_ids) + 1
        if keep < n_layers:
            tc.num_hidden_layers = keep
            if isinstance(getattr(tc, "layer_types", None), list):
                tc.layer_types = tc.layer_types[:keep]
            if isinstance(getattr(tc, "mlp_only_layers", None), list):
                tc.mlp_only_layers = [i for i in tc.mlp_only_layers if i < keep]


def has_linear_attention(config) -> bool:
    """Whether the decoder has layers other than (sliding) attention (Gated DeltaNet, Mamba, ...)."""
    tc = text_config_of(config)
    types = getattr(tc, "layer_types", None) or []
    return any(t not in ("full_attention", "sliding_attention") for t in types)


def _one_document_per_row(doc_ids: torch.Tensor) -> None:
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    docs = int((start & (doc_ids >= 0)).sum(dim=1).max())  # padding (negative ids) is no document
    if docs > 1:
        raise ValueError(
            f"a row packs {docs} documents, but this target's linear-attention layers would carry "
            "their state from one document into the next: one document per row (--max-batch-size 1)"
        )


@dataclass(frozen=True, eq=False)
class HookCapture(Capture):
    """transformers' own forward with forward hooks on the captured layers (any decoder; module docstring)."""

    kind = "hooks"
    attn: str | None = None
    compiled: bool = False

    def __call__(self, model, input_ids, doc_ids, target_layer_ids, need_final_hidden):
        base = decoder_of(model)
        if has_linear_attention(model.config):
            _one_document_per_row(doc_ids)
        layers = base.layers
        check_layer_ids(target_layer_ids, len(layers))
        last = max(target_layer_ids)
        got: dict[int, torch.Tensor] = {}

        def hook_for(i: int):
            def hook(_mod, _args, out):
                got[i] = out[0] if isinstance(out, (tuple, list)) else out
                if i == last and not need_final_hidden:
                    raise _StopForward

            return hook

        handles = [layers[i].register_forward_hook(hook_for(i)) for i in sorted(set(target_layer_ids))]
        position_ids = doc_positions(doc_ids.to(input_ids.device))
        final = None
        try:
            with torch.no_grad():
                out = base(input_ids=input_ids, position_ids=position_ids, use_cache=False)
                final = out.last_hidden_state
        except _StopForward:
            pass
        finally:
            for h in handles:
                h.remove()
        hidden_cat = torch.cat([got[i] for i in target_layer_ids], dim=-1)
        return hidden_cat, (final if need_final_hidden else None)


HOOKS = HookCapture()


def capture_of(model: nn.Module) -> Capture:
    """The model's capture path: the one ``load_target`` / ``prepare_*`` attached, else the hook path."""
    cap = getattr(model, ATTR, None)
    return HOOKS if cap is None else cap


def capture(
    model: nn.Module,
    input_ids: torch.Tensor,
    doc_ids: torch.Tensor,
    target_layer_ids: list[int],
    need_final_hidden: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return capture_of(model)(model, input_ids, doc_ids, target_layer_ids, need_final_hidden)
