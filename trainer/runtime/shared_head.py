"""The frozen head from the target loaded in this process: its embed_tokens, final norm and lm_head tensors
shared (same storage, no copy, no second read of the safetensors files).

In single-process mode the target and the drafter live in one process; when a target is on the drafter's
device in the head's dtype, ``FrozenHead.from_pretrained(..., shared=target_head_tensors(...))`` takes those
tensors from it instead of reading them again (about 2.5 GB at the 8B shape, 5.1 GB at 27B). A tensor the
target does not hold (a cut target without final norm or lm_head, a meta or other-device/dtype tensor) is
read from the files as before. Both layers meet here: the runtime layer imports target and drafting.
"""

from __future__ import annotations

import torch
from torch import nn


def _same_device(t: torch.Tensor, device: str | torch.device) -> bool:
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:
        want = torch.device("cuda", torch.cuda.current_device())
    return t.device == want


def target_head_tensors(model: nn.Module, device: str | torch.device, dtype: torch.dtype) -> dict:
    """``{"embed_tokens", "norm", "lm_head"}`` -> the target's weight tensor, for those it holds on
    ``device`` in ``dtype`` (the others are left out: the head reads them from the files)."""
    from trainer.target.capture import decoder_of

    base = decoder_of(model)
    found = {
        "embed_tokens": getattr(model.get_input_embeddings(), "weight", None),
        "norm": getattr(getattr(base, "norm", None), "weight", None),
        "lm_head": getattr(
            model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None, "weight", None
        ),
    }
    return {
        k: t
        for k, t in found.items()
        if isinstance(t, torch.Tensor) and not t.is_meta and t.dtype == dtype and _same_device(t, device)
    }


def head_from_target(target_path: str, model: nn.Module, device: str | torch.device, dtype: torch.dtype):
    """The FrozenHead sharing ``model``'s tensors where it can, reading the rest from ``target_path``."""
    from trainer.drafting.head import FrozenHead

    return FrozenHead.from_pretrained(
        target_path, dtype=dtype, device=device, shared=target_head_tensors(model, device, dtype)
    )
