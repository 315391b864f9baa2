"""bench_acceptance.py's FP8 target (issue 36): the controlled comparison of drafters trained on FP8-captured and on
bf16-captured hidden states (``--blocks 8:2:dflash@fp8``, bench/acceptance_specs.py), each served by both.

The FP8 version of the bench's target is written once, beside it (``work/target_fp8``), as the checkpoint users
serve: Qwen's block-128 FP8 layout (every decoder layer's linear weight but the ones Qwen's releases keep in
bf16, ``fp8.KEEP``, as e4m3 with a float32 ``weight_scale_inv`` per 128 x 128 block, ``fp8.quantise``: the
quantise-on-load of ``--target-dtype fp8``; ``quantization_config.quant_method = "fp8"``); embeddings, norms,
the lm_head, the conv and the Gated DeltaNet's a / b projections stay as trained. An ``@fp8`` drafter trains
with ``--target-model work/target_fp8 --target-dtype fp8``, and every FP8-served evaluation runs
``trainer.evaluate`` with the same two flags; the bf16 ones are as before (``work/target``).

What "FP8" means where it runs (``fp8_facts``, in results.json as ``fp8_target``): on an H200 a projection
whose shape cuBLAS's block-scaled matmul takes (``fp8.fits_scaled_mm``: K / 128 a multiple of 4) runs W8A8
(activations quantised per token and 128 columns); any other, and every projection on the CPU (where the
FP8 checkpoint runs dequantised, for the smoke run), runs its dequantised e4m3 weights (W8A16): the weights'
rounding, not the activations'. The h384 shape (K = 384 and 1,152: 3 and 9 blocks) has none that fits today.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

FP8_TARGET = "target_fp8"
GOAL = (
    0.98  # issue 36: the FP8-trained drafter's acceptance >= 0.98 of the bf16-trained one's, served by either
)


def target_dir(work: str, dtype: str | None) -> str:
    """The target a drafter trains against or an evaluation serves: ``work/target`` (bf16), ``work/target_fp8``."""
    return os.path.join(work, FP8_TARGET if dtype == "fp8" else "target")


def dtype_flags(dtype: str | None, scales: str = "block") -> list[str]:
    """The trainer's / trainer.evaluate's flags for that target (none for bf16: as before); ``scales``: the FP8
    matmul's scaling (``--fp8-scales``)."""
    return ["--target-dtype", "fp8", "--fp8-scales", scales] if dtype == "fp8" else []


def check_device(device: str) -> str:
    """A GPU that cannot run the block-scaled FP8 matmul is refused (SystemExit, the reason) before the target
    is trained; the CPU runs the FP8 checkpoint dequantised (what it means: the module docstring)."""
    from trainer.target import fp8

    if not device.startswith("cuda"):
        return "the CPU runs the FP8 checkpoint dequantised: FP8 weights, unquantised activations (W8A16)"
    why = fp8.fp8_unsupported(device)
    if why is not None:
        raise SystemExit(f"--blocks ...@fp8: FP8 capture and serving need the FP8 matmul: {why}")
    return "on an sm_90 GPU: W8A8 where fp8.fits_scaled_mm takes the shape, else the dequantised weights"


def _quantised(key: str, t) -> bool:
    """A decoder layer's linear weight that Qwen's FP8 releases quantise (2-D; not ``fp8.KEEP``'s)."""
    from trainer.target import fp8

    name = key.removesuffix(".weight")
    return key.endswith(".weight") and ".layers." in key and t.dim() == 2 and not name.endswith(fp8.KEEP)


def write_fp8_target(src: str, dst: str, scales: str = "block") -> dict:
    """``src`` (a bf16 / fp32 transformers directory) as an FP8 checkpoint in ``dst``; its facts (``fp8_facts``)
    when it runs with ``scales``."""
    from safetensors.torch import load_file, save_file

    from trainer.target import fp8

    os.makedirs(dst, exist_ok=True)
    for fn in os.listdir(src):
        if not fn.endswith(".safetensors") and os.path.isfile(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), dst)
    shapes, kept = [], set()
    for path in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors = load_file(path)
        for key in list(tensors):
            if _quantised(key, tensors[key]):
                q, s = fp8.quantise(tensors[key])
                tensors[key], tensors[fp8.scale_key(key)] = q, s
                shapes.append(tuple(q.shape))
            elif key.endswith(".weight") and key.removesuffix(".weight").endswith(fp8.KEEP):
                kept.add(key.removesuffix(".weight"))
        save_file(tensors, os.path.join(dst, os.path.basename(path)), metadata={"format": "pt"})
    _write_config(dst, sorted(kept))
    return fp8_facts(dst, shapes, sorted(kept), scales)


def _write_config(dst: str, kept: list[str]) -> None:
    with open(os.path.join(dst, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "modules_to_not_convert": kept}  # fmt: skip
    with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)


def fp8_facts(dst: str, shapes: list[tuple[int, int]], kept: list[str], scales: str = "block") -> dict:
    """How many projections are FP8, and how many of them an H200 runs as W8A8 with ``scales`` (the shapes that
    do not fit run their dequantised weights)."""
    from trainer.target import fp8

    fit = [s for s in shapes if fp8.fits(scales, *s)]
    return {"dir": dst, "scales": scales, "fp8_projections": len(shapes), "fp8_matmul_on_h200": len(fit),
            "dequantised_on_h200": len(shapes) - len(fit),
            "shapes_not_fitting": sorted({f"{o}x{i}" for o, i in set(shapes) - set(fit)}),
            "kept_bf16": kept}  # fmt: skip


def _cmp(one: dict, two: dict) -> dict | None:
    from trainer.evaluation.report import paired_ratio

    if "prompt_steps" not in one or "prompt_steps" not in two:
        return None
    out = paired_ratio(one, two)
    return {
        **out,
        "goal": GOAL,
        "ratio_meets_goal": out["ratio"] >= GOAL,
        "ci95_low_meets_goal": out["ci95"][0] >= GOAL,
    }


def capture_comparisons(res: dict, target: str, pairs: list[tuple[str, str]], keys: list[str]) -> dict:
    """The paired ratios (report.paired_ratio, 95% interval over prompts) to add to results.json:
    FP8-captured over bf16-captured under each serving dtype (``<fp8 key>_vs_<twin>_bf16serve`` / ``_fp8serve``,
    ``qwen3_5_h384_block8_dflash_fp8cap_vs_8_dflash_fp8serve``) and, for each FP8-served drafter of ``keys``,
    FP8 serving over bf16 serving (``<key>_fp8serve_vs_bf16serve``). Pairs not both evaluated are left out."""
    out: dict = {}
    for base, fp8_key in pairs:
        short = base.removeprefix(f"{target}_").removeprefix("block")
        for serve, field in (("bf16", "eval"), ("fp8", "eval_fp8serve")):
            got = _cmp(*((res.get(k, {}).get(field) or {}) for k in (base, fp8_key)))
            if got is not None:
                out[f"{fp8_key}_vs_{short}_{serve}serve"] = {"a": base, "b": fp8_key, "serve": serve, **got}
    for key in keys:
        got = _cmp(*((res.get(key, {}).get(f) or {}) for f in ("eval", "eval_fp8serve")))
        if got is not None:
            out[f"{key}_fp8serve_vs_bf16serve"] = {"a": "bf16 serving", "b": "fp8 serving", **got}
    return out
