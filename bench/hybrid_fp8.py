"""bench_hybrid.py's FP8 parts: the bench model quantised on load in place, in both scalings, the FP8 capture's
error per captured layer against bf16, and FP8 against bf16 in one line (the issue-36 goal: >= 17,000 tok/s
and >= 1.4x bf16), for block and for rowwise scales.

``quantise(model, device) -> (record, Variants)``: each decoder projection (except Qwen's kept ``in_proj_a``
/ ``in_proj_b``) quantised from its bf16 weight twice, as ``fp8.quantise_model`` would with ``scales="block"``
(block-128 e4m3 weights with their scales, ``dflash::fp8_block_mm``) and with ``scales="row"`` (one scale
per row, ``dflash::fp8_row_mm``), on CUDA for the shapes each matmul takes; the block set goes into the model
at once, each bf16 weight then held only by the two sets (freed), the row set waits for ``Variants.use``.
The device is asked first (``fp8.wants_fp8``, which refuses a GPU without block-scaled FP8 with the reason).
The CPU has no FP8 matmul and ``wants_fp8`` refuses to quantise a bf16 model there; for the ``--tiny`` smoke
run the bench quantises every decoder projection itself, whatever its shape, and the model runs
``Fp8Linear``'s CPU path: the dequantised weights (the weights' quantisation error, not the activations').
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


def _names(model: nn.Module, device: str, scales: str) -> list[str]:
    """The layers quantised for ``scales``: on CUDA ``fp8.quantise_model``'s choice, on the CPU every one."""
    return fp8.quantisable(model, scales if device == "cuda" else None)


class Variants:
    """The model's projections in both FP8 layouts, quantised from the same bf16 weights: ``mods[scales]``
    maps each layer's name to its ``Fp8Linear`` of those scales (or the bf16 ``nn.Linear`` where that scaling
    does not take the shape); ``use(scales)`` puts one set into the model. The block set goes in as it is
    made, each bf16 weight then held only by the sets."""

    def __init__(self, model: nn.Module, device: str):
        self.model = model
        self.mods: dict[str, dict[str, nn.Module]] = {s: {} for s in fp8.SCALES}
        row = set(_names(model, device, "row"))
        block = set(_names(model, device, "block"))
        for n in sorted(row | block):
            lin = model.get_submodule(n)
            for s, fit in (("block", n in block), ("row", n in row)):
                self.mods[s][n] = fp8.Fp8Linear.from_linear(lin, s) if fit else lin
            model.set_submodule(n, self.mods["block"][n])

    def use(self, scales: str) -> None:
        for n, m in self.mods[scales].items():
            self.model.set_submodule(n, m)

    def count(self, scales: str) -> int:
        return sum(isinstance(m, fp8.Fp8Linear) for m in self.mods[scales].values())

    def rows_from_block(self) -> None:
        """The row set replaced by the block set converted per row (``Fp8Linear.to_rows``: the path of an FP8
        checkpoint run with ``--fp8-scales row``)."""
        for n, m in self.mods["block"].items():
            if isinstance(m, fp8.Fp8Linear):
                self.mods["row"][n] = m.to_rows()


def quantise(model: nn.Module, device: str) -> tuple[dict, Variants]:
    """The model's projections to FP8 in place, block scales in, rowwise ones aside (module docstring); what
    was done, for the results."""
    t0 = time.perf_counter()
    if device == "cuda":
        fp8.wants_fp8("fp8", False, device)  # RuntimeError with the reason on a GPU without block-scaled FP8
        torch._dynamo.reset()  # the bf16 regions' graphs and guards go: nothing holds the bf16 weights
        how = "block: dflash::fp8_block_mm, row: dflash::fp8_row_mm (torch._scaled_mm); shapes that fit each"
    else:
        try:
            fp8.wants_fp8("fp8", False, device)
            refused = None
        except ValueError as e:
            refused = str(e)
        how = (
            f"CPU smoke run: every projection quantised by the bench, run dequantised (wants_fp8: {refused})"
        )
    v = Variants(model, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    out = {"quantised_linears": v.count("block"), "row_linears": v.count("row")}
    out.update(quantise_s=time.perf_counter() - t0, how=how)
    out["kept_bf16_linears"] = sum(1 for m in model.modules() if type(m) is nn.Linear)  # lm_head, a / b
    if device == "cuda":
        out["allocated_gib_after"] = torch.cuda.memory_allocated() / 2**30  # both sets
    return out, v


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
    """``accuracy_fp32``'s FP8 columns: the model (bf16, its first layers) quantised in both layouts, then the
    fast path (eager) on each row of ``rows`` for block scales (``fp8_*``), rowwise scales quantised from bf16
    (``fp8row_*``) and rowwise scales converted from the block ones (``fp8row_from_block_*``): the error per
    layer against the fp32 reference (``errs(got, key)``) and against the bf16 fast path's ``bf16_out[key]``."""
    rec, v = quantise(model, device)
    out = {"fp8_quantise": rec}
    for label, convert in (("fp8", None), ("fp8row", None), ("fp8row_from_block", v.rows_from_block)):
        if convert is not None:
            convert()
        v.use("block" if label == "fp8" else "row")
        prepare_hybrid(model, fast=True, compile=False)
        for k, d in rows.items():
            got = capture(model, ids, d, layers)[0]
            out[f"{label}_fast_eager_{k}"] = errs(got, k)
            out[f"{label}_vs_bf16_fast_eager_{k}"] = by_layer(got, bf16_out[k], len(layers))
    return out
