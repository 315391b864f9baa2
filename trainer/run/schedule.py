"""Learning-rate and feature-noise schedules, pure functions of the optimizer step.

Being functions of the step alone, they need no state of their own in a checkpoint: the step is it.
"""

from __future__ import annotations

import math


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    return int(math.ceil(total_steps * warmup_ratio))


def lr_at(step: int, *, base_lr: float, total_steps: int, warmup_ratio: float) -> float:
    """LR for optimizer step ``step`` (0-based): linear warmup to ``base_lr``, then cosine decay to 0."""
    w = warmup_steps(total_steps, warmup_ratio)
    if step < w:
        return base_lr * (step + 1) / w
    span = max(1, total_steps - w)
    progress = min(1.0, (step - w) / span)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def noise_at(step: int, *, start: float, end: float, total_steps: int) -> float:
    """Noise scale on the target features: linear from ``start`` (step 0) to ``end`` (last step)."""
    if total_steps <= 1:
        return start
    f = min(1.0, step / (total_steps - 1))
    return start + (end - start) * f
