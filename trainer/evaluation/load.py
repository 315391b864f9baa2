"""Loading what an evaluation needs: the whole target (with its lm_head) and a drafter directory.

``resolve_drafter_dir(path)`` accepts a drafter directory itself (``config.json`` + ``model.safetensors``: the
trainer's ``drafter/`` or ``export/``, or a published DFlash drafter), a checkpoint ``step_N/`` (its
``export/`` if present, else its ``drafter/``) or a run directory (its newest complete checkpoint).
``load_drafter_any(dir, device, dtype)`` reads every layout ``trainer.exporting.peers`` does (ours, z-lab's,
SpecForge's ``export --to hf``, speculators' DFlash and DFlash 2): ``block_size`` at the top level or inside
``dflash_config``; ``num_target_layers`` may be missing (then from the target's config); extra tensors of
published files that are not weights (``rotary_emb.inv_freq``, speculators' ``t2d``/``d2t``) are ignored, a
missing weight is an error.
"""

from __future__ import annotations

import json
import os

import torch

from trainer.exporting import peers
from trainer.exporting.reader import ReadError
from trainer.run import checkpoint
from trainer.run.fp8_config import read_dir


class EvalError(ValueError):
    """Bad input to an evaluation (a path, a prompt file): reported as ``error: ...``, exit status 2."""


def _is_drafter_dir(p: str) -> bool:
    return os.path.isfile(os.path.join(p, "config.json")) and os.path.isfile(
        os.path.join(p, "model.safetensors")
    )


def resolve_drafter_dir(path: str) -> str:
    if _is_drafter_dir(path):
        return path
    for sub in ("export", "drafter"):
        if _is_drafter_dir(os.path.join(path, sub)):
            return os.path.join(path, sub)
    ckpts = os.path.join(path, "checkpoints")
    if os.path.isdir(ckpts):
        latest = checkpoint.latest(ckpts)
        if latest is None:
            raise EvalError(f"--drafter: run directory {path!r} has no complete checkpoint")
        return resolve_drafter_dir(latest)
    raise EvalError(
        f"--drafter: {path!r} is not a drafter directory (config.json + model.safetensors), "
        "a checkpoint or a run directory"
    )


def target_text_config(target_dir: str) -> dict:
    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as f:
        top = json.load(f)
    return top.get("text_config") or top


def load_drafter_any(drafter_dir: str, target_dir: str, device, dtype: torch.dtype):
    from safetensors.torch import load_file

    from trainer.model import DFlashDrafter, config_from_json

    n_target = int(target_text_config(target_dir)["num_hidden_layers"])
    try:  # ours, z-lab's, SpecForge's or speculators' config.json, bounded (trainer/exporting/peers.py)
        d, _fmt = peers.read_config(drafter_dir, n_target)
        cfg = config_from_json(d)
    except ReadError as e:
        raise EvalError(f"--drafter: {e}") from None
    except (KeyError, ValueError, TypeError) as e:  # FormatError too: a ValueError
        raise EvalError(f"--drafter: {drafter_dir}/config.json: {e}") from None
    state = peers.drafter_tensors(load_file(os.path.join(drafter_dir, "model.safetensors"), device="cpu"))
    drafter = DFlashDrafter(cfg)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing:
        raise EvalError(f"--drafter: {drafter_dir}/model.safetensors lacks {sorted(missing)[:4]}")
    if unexpected:
        print(
            f"note: ignored {len(unexpected)} tensor(s) of the drafter file: {sorted(unexpected)[:4]}",
            flush=True,
        )
    return drafter.to(device=device, dtype=dtype).eval(), cfg


def load_target_model(
    target_dir: str,
    device,
    dtype: torch.dtype,
    target_dtype: str | None = None,
    fp8_scales: str | None = None,
):
    """The whole target (lm_head included). An FP8 checkpoint, or ``target_dtype`` given (bf16 / fp8, as
    ``--target-dtype``), is read by the trainer's own loader (``loading.load_text_model``: FP8 projections, or
    an FP8 checkpoint dequantised; ``fp8_scales``: ``--fp8-scales``); any other through transformers'
    ``from_pretrained``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if target_dtype is not None or read_dir(target_dir) is not None:
        model = _load_text_model(target_dir, device, dtype, target_dtype, fp8_scales)
    else:
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def resolve_target_dtype(
    target_dir: str, requested: str | None, device, fp8_scales: str | None = None
) -> tuple[str, bool]:
    """``--target-dtype`` for this target and device, and whether its checkpoint is FP8: (``"bf16"`` /
    ``"fp8"``, fp8 checkpoint). None is fp8 for an FP8 checkpoint, else bf16 (``fp8.wants_fp8``); a device
    that cannot run the choice (the CPU with a bf16 checkpoint, a GPU without block-scaled FP8) is refused with
    the reason, as EvalError, before anything is loaded; so is ``--fp8-scales`` for a target that runs bf16."""
    from trainer.target import fp8

    try:
        ckpt_fp8 = read_dir(target_dir) is not None
    except ValueError as e:
        raise EvalError(f"--target-model: {e}") from None
    try:
        use = fp8.wants_fp8(requested, ckpt_fp8, device)
    except (ValueError, RuntimeError) as e:
        raise EvalError(f"--target-dtype: {e}") from None
    try:
        fp8.scales_for(fp8_scales, use)
    except ValueError as e:
        raise EvalError(str(e)) from None
    return ("fp8" if use else "bf16"), ckpt_fp8


def fp8_linears(model, device) -> dict:
    """How many of the target's linear layers hold FP8 weights, and how many of those run the FP8 matmul
    on ``device`` (the rest: ``F.linear`` on their dequantised weights, ``fp8.Fp8Linear``)."""
    from trainer.target.fp8 import Fp8Linear

    lin = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    on_gpu = torch.device(device).type == "cuda"
    return {"target_fp8_linears": len(lin), "target_fp8_matmul_linears": sum(on_gpu and m.fast for m in lin)}


def _load_text_model(
    target_dir: str, device, dtype: torch.dtype, target_dtype: str | None, fp8_scales: str | None = None
):
    from transformers import AutoConfig, GenerationConfig

    from trainer.drafting.config import text_config_of
    from trainer.target.loading import load_text_model

    tc = text_config_of(AutoConfig.from_pretrained(target_dir))
    model = load_text_model(target_dir, tc, device, dtype, target_dtype=target_dtype, fp8_scales=fp8_scales)
    if os.path.isfile(os.path.join(target_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(target_dir)
    return model


def eos_ids_of(model, tokenizer=None) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
