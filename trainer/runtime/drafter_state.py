"""``DrafterState``: what a drafter's training is at, in one object (built by runtime/build.py, advanced by
the step loop in runtime/loop.py, written and read back by runtime/checkpointing.py and build.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DrafterState:
    """The drafter, its frozen head and optimizer, the anchor/noise generator; the data and where the run
    stands in it (optimizer ``step``, data ``cursor``: the next micro-batch), the running estimate's window.

    ``head`` is None until a target in this process lends it its tensors (runtime/sources.py);
    ``optimizer_load``: a resume's optimizer state still loading in the background (``optimizer_ready``)."""

    cfg: Any  # drafting.config.DraftConfig
    ds: Any  # data.dataset.Dataset
    plan: Any  # data.dataset.Plan
    total_steps: int
    drafter: Any  # model.DFlashDrafter
    head: Any  # drafting.head.FrozenHead | None
    head_dtype: Any
    optimizer: Any
    generator: Any
    step: int = 0
    cursor: int = 0
    resumed_step: int | None = None  # the step of the checkpoint this process resumed from
    # (chain sum, blocks, walk tokens, walk steps) of the last EST_WINDOW steps (drafting.acceptance)
    est_window: list[tuple[float, ...]] = field(default_factory=list)
    save_seconds: list[float] = field(default_factory=list)  # durations of past saves (expected_s)
    optimizer_load: Any = None  # runtime.background.Background | None

    def optimizer_ready(self) -> None:
        """Wait for a resume's optimizer state (loaded in the background); raises what its load raised."""
        if self.optimizer_load is not None:
            job, self.optimizer_load = self.optimizer_load, None
            job.result()

    def data_end(self, grad_accum: int, replicas: int) -> int:
        """The micro-batch after the last one the remaining steps take (over all replicas)."""
        return min(self.plan.total, self.cursor + (self.total_steps - self.step) * grad_accum * replicas)
