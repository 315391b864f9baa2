"""The FP8 tests' own reference, written apart from trainer/target/fp8.py: block-by-block loops (no padding,
no repeat_interleave), and a writer of FP8 checkpoints in Qwen's layout from a bf16 / fp32 one."""

from __future__ import annotations

import json
import math
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

B = 128
QCONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [B, B]}


def ref_quantise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block: scale_inv = amax / 448, q = w / scale_inv in e4m3."""
    out, inn = w.shape
    rows, cols = math.ceil(out / B), math.ceil(inn / B)
    q = torch.empty(out, inn, dtype=torch.float8_e4m3fn)
    s = torch.empty(rows, cols, dtype=torch.float32)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * B : (i + 1) * B, j * B : (j + 1) * B].float()
            amax = blk.abs().max()
            s[i, j] = amax / 448.0 if amax > 0 else 1.0
            q[i * B : (i + 1) * B, j * B : (j + 1) * B] = (
                (blk / s[i, j]).clamp(-448, 448).to(torch.float8_e4m3fn)
            )
    return q, s


def ref_dequantise(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = q[i * B : (i + 1) * B, j * B : (j + 1) * B].float()
            out[i * B : (i + 1) * B, j * B : (j + 1) * B] = blk * s[i, j]
    return out


PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
PROJECTIONS |= {"in_proj_qkv", "in_proj_z", "out_proj"}  # the Gated DeltaNet's (not its tiny in_proj_a / b)


def is_projection(key: str) -> bool:
    """The decoder layers' linear weights Qwen's FP8 releases quantise."""
    parts = key.split(".")
    return (
        ".layers." in key
        and parts[-1] == "weight"
        and parts[-2] in PROJECTIONS
        and "visual" not in key
        and parts[0] != "mtp"
    )


def write_fp8(
    src: str, dst: str, *, keep=(), listed=(), drop_scale=None, scale_shape=None, scale_dtype=None
) -> dict:
    """Copy checkpoint ``src`` to ``dst`` with every ``is_projection`` weight (but those in ``keep``) as e4m3 +
    ``weight_scale_inv``, and the FP8 quantization_config (``keep`` and ``listed`` as modules_to_not_convert).
    ``drop_scale`` / ``scale_shape`` / ``scale_dtype``: break that one weight's scale (key). Returns
    {weight key: (q, s)}."""
    os.makedirs(dst, exist_ok=True)
    for fn in os.listdir(src):
        if fn != "model.safetensors" and os.path.isfile(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), dst)
    tensors, done = load_file(os.path.join(src, "model.safetensors")), {}
    for key in list(tensors):
        if is_projection(key) and key.removesuffix(".weight") not in keep:
            q, s = ref_quantise(tensors[key])
            tensors[key], done[key] = q, (q, s)
            skey = key.removesuffix("weight") + "weight_scale_inv"
            if skey == drop_scale:
                continue
            if skey == scale_shape:
                s = torch.ones(s.shape[0] + 1, s.shape[1])
            if skey == scale_dtype:
                s = s.to(torch.bfloat16)
            tensors[skey] = s
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {**QCONFIG, "modules_to_not_convert": [*keep, *listed]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return done


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())
