"""bench_hybrid.py's FP8 parts: the bench model quantised on load in place, the FP8 capture's error per captured
layer against bf16, and FP8 against bf16 in one line (the issue-36 goal: >= 17,000 tok/s and >= 1.4x bf16).

``quantise(model, device)``: on CUDA ``fp8.quantise_model`` (every decoder projection that fits the
block-scaled FP8 matmul, except Qwen's kept ``in_proj_a`` / ``in_proj_b``: block-128 e4m3 weights with their
scales, each bf16 weight freed as it goes; the device is asked first, ``fp8.wants_fp8``, which refuses one
without block-scaled FP8 with the reason). The CPU has no FP8 matmul and ``wants_fp8`` refuses to quantise
a bf16 model there; for the ``--tiny`` smoke run the bench quantises every decoder projection itself
(``fp8.Fp8Linear.from_linear``, whatever its shape) and the model runs ``Fp8Linear``'s CPU path: the
dequantised weights (the weights' quantisation error, not the activations').
"""

from __future__ import annotations

import time

import torch
from torch import nn

from trainer.target import fp8
from trainer.target.capture import capture
from trainer.target.hybrid import prepare_hybrid

GOAL_TOK_S = 17_000
GOAL_RATIO = 1.4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def by_layer(got: torch.Tensor, want: torch.Tensor, n: int) -> list[float]:
    """Relative L2 error of each of the ``n`` captured layers in (..., n * H) features."""
    H = want.shape[-1] // n
    return [rel(got[..., k * H : (k + 1) * H], want[..., k * H : (k + 1) * H]) for k in range(n)]


def quantise_all(model: nn.Module) -> int:
    """The CPU smoke run's quantisation: every decoder ``nn.Linear`` except ``fp8.KEEP``, any shape."""
    names = [
        n
        for n, m in model.named_modules()
        if type(m) is nn.Linear and ".layers." in f".{n}" and not n.endswith(fp8.KEEP)
    ]
    for n in names:
        model.set_submodule(n, fp8.Fp8Linear.from_linear(model.get_submodule(n)))
    return len(names)


def quantise(model: nn.Module, device: str) -> dict:
    """The model's projections to FP8 in place (module docstring); what was done, for the results."""
    t0 = time.perf_counter()
    if device == "cuda":
        fp8.wants_fp8("fp8", False, device)  # RuntimeError with the reason on a GPU without block-scaled FP8
        torch._dynamo.reset()  # the bf16 regions' graphs and guards go: nothing holds the bf16 weights
        n = fp8.quantise_model(model)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        how = "fp8.quantise_model: block-128 e4m3 weights, dflash::fp8_block_mm (torch._scaled_mm)"
    else:
        try:
            fp8.wants_fp8("fp8", False, device)
            refused = None
        except ValueError as e:
            refused = str(e)
        n = quantise_all(model)
        how = (
            f"CPU smoke run: every projection quantised by the bench, run dequantised (wants_fp8: {refused})"
        )
    out = {"quantised_linears": n, "quantise_s": time.perf_counter() - t0, "how": how}
    kept = sum(1 for m in model.modules() if type(m) is nn.Linear)
    out["kept_bf16_linears"] = kept  # lm_head and the a / b projections
    if device == "cuda":
        out["allocated_gib_after"] = torch.cuda.memory_allocated() / 2**30
    return out


def versus(res: dict, bf16: str = "direct_packed", fp8_step: str = "fp8_packed") -> dict | None:
    """FP8 against bf16 in the same call: tok/s, their ratio, the goals."""
    a, b = res["steps"].get(bf16, {}), res["steps"].get(fp8_step, {})
    if "tok_s" not in a or "tok_s" not in b:
        return None
    ratio = b["tok_s"] / a["tok_s"]
    return {
        "bf16_tok_s": a["tok_s"],
        "fp8_tok_s": b["tok_s"],
        "fp8_over_bf16": ratio,
        "goal_tok_s": GOAL_TOK_S,
        "goal_ratio": GOAL_RATIO,
        "goal_met": b["tok_s"] >= GOAL_TOK_S and ratio >= GOAL_RATIO,
        "fp8_vs_bf16_rel_err_by_layer": b.get("vs_bf16_by_layer"),
    }


def fp8_columns(model, ids, rows: dict, layers: list[int], errs, bf16_out: dict, device: str) -> dict:
    """``accuracy_fp32``'s FP8 columns: the model (bf16, its first layers) quantised in place, then the fast path
    (eager) on each row of ``rows``: the error per layer against the fp32 reference (``errs(got, key)``) and
    against the bf16 fast path's output ``bf16_out[key]``."""
    out = {"fp8_quantise": quantise(model, device)}
    prepare_hybrid(model, fast=True, compile=False)
    for k, d in rows.items():
        got = capture(model, ids, d, layers)[0]
        out[f"fp8_fast_eager_{k}"] = errs(got, k)
        out[f"fp8_vs_bf16_fast_eager_{k}"] = by_layer(got, bf16_out[k], len(layers))
    return out
