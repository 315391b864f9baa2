"""Where speculative decoding's greedy output leaves the target's own, and by how much the target was torn there.

At temperature 0 speculative decoding is lossless in exact arithmetic, but on a GPU in bf16 the target verifies a
block of positions in one forward while target-only decoding runs one position at a time: different kernels,
different summation orders, so a near-tie between the two best tokens can tip either way. A bug (a wrong
roll-back, a leaked state) gives a different picture: divergences where the target was not torn at all.

``divergence`` tells the two apart for one prompt: the first position where the outputs differ, and the target's
logits for the two tokens there, from a fresh prefill of prompt + the common prefix (a third summation order,
neither decoder's). ``gap`` is how far the target-only token leads; ``rel_gap`` is it over the largest logit's
magnitude. A near tie is ``rel_gap`` below ``NEAR_TIE``: about twice the relative difference the two decoders'
paths give the same hidden states in bf16 (0.6-1.1e-2 per layer on the trained hybrid h384 target, one H200,
lab/capture_vs_serve.py).
"""

from __future__ import annotations

NEAR_TIE = 2.0**-6  # 1.6e-2


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length where one is a prefix of the
    other); None where they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(target, prompt: list[int], base: list[int], spec: list[int]) -> dict | None:
    """The first difference of ``spec`` from ``base`` (the target's own greedy output) after ``prompt``, and the
    target's logits for both tokens there (``target``: the evaluation's engine, re-prefilled). None where equal."""
    import torch

    at = first_difference(base, spec)
    if at is None:
        return None
    out: dict = {"at": at}
    if at >= min(len(base), len(spec)):  # one stopped (EOS / length) where the other went on
        out["ended"] = "base" if len(base) == at else "spec"
        return out
    with torch.no_grad():
        logits, _ = target.prefill(list(prompt) + list(base[:at]), want_features=False)
    row = logits[-1].float()
    la, lb = float(row[base[at]]), float(row[spec[at]])
    scale = float(row.abs().max())
    out.update(
        base_token=base[at], spec_token=spec[at], gap=la - lb, rel_gap=abs(la - lb) / max(scale, 1e-30)
    )
    out["near_tie"] = out["rel_gap"] <= NEAR_TIE
    return out


def summary(found: list[dict]) -> dict:
    """The report's fields over the prompts that diverged."""
    gaps = [d["rel_gap"] for d in found if "rel_gap" in d]
    return {
        "greedy_mismatches_near_tie": sum(1 for d in found if d.get("near_tie")),
        "greedy_mismatch_max_rel_gap": max(gaps) if gaps else None,
        "greedy_divergences": found,
    }
