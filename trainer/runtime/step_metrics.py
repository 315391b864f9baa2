"""An optimizer step's metrics by name (``StepMetrics``), packed into one tensor for the replicas'
all-reduce and read back in one host sync; the running acceptance estimate over the last steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SELECTOR_FIELDS = ("selector_loss", "selector_recall", "selector_acc")  # DFlash 2's step-record fields
EST_WINDOW = 50  # steps in the running mean of accept_len_est


@dataclass(frozen=True)
class StepMetrics:
    """A step's sums over its micro-batches (over every replica's, once all-reduced). As ``of`` makes them:
    float64 tensors on the drafter's device (no host sync); as ``unpack`` reads them back: floats.

    ``acc`` has one entry per predicted block position; ``selector`` holds DFlash 2's sums (``SELECTOR_FIELDS``
    present in the micro-steps' metrics; none for DFlash 1); ``grad_norm`` (the clipped gradient's norm, the
    same on every replica) is not summed: only ``unpack`` fills it."""

    loss: Any
    chain_sum: Any
    walk_tokens: Any
    walk_steps: Any
    acc: Any
    accept_len: Any
    blocks: Any
    tokens: Any
    selector: dict[str, Any] = field(default_factory=dict)
    grad_norm: float | None = None

    @classmethod
    def of(cls, micro: list[dict], tokens: int) -> StepMetrics:
        """The sums of the micro-steps' metrics (``DrafterRole.micro_step``) and of their ``tokens``."""
        import torch

        def total(k: str):
            return torch.stack([m[k].double() for m in micro]).sum().view(1)

        return cls(
            loss=total("loss"),
            chain_sum=total("chain_sum"),
            walk_tokens=total("walk_tokens"),
            walk_steps=total("walk_steps"),
            acc=torch.stack([m["acc"].double() for m in micro]).sum(0),
            accept_len=total("accept_len"),
            blocks=total("n_blocks"),
            tokens=torch.tensor([float(tokens)], dtype=torch.float64, device=micro[0]["loss"].device),
            selector={k: total(k) for k in SELECTOR_FIELDS if k in micro[0]},
        )

    SUMMED = ("loss", "chain_sum", "walk_tokens", "walk_steps", "acc", "accept_len", "blocks", "tokens")

    def _parts(self) -> list[tuple[str, Any]]:
        """What the all-reduce sums, in packing order: the selector's sums, then ``SUMMED``."""
        return [
            *(("selector", v) for v in self.selector.values()),
            *((f, getattr(self, f)) for f in self.SUMMED),
        ]

    def pack(self) -> Any:
        """One float64 vector of ``_parts`` (what the all-reduce sums)."""
        import torch

        return torch.cat([v for _, v in self._parts()])

    def unpack(self, packed, grad_norm) -> StepMetrics:
        """``packed`` (this one's ``pack``, summed over the replicas) and the step's gradient norm read back
        together (the step's one host sync), as floats, split by the sizes of this one's parts."""
        import torch

        *vals, norm = torch.cat([packed, grad_norm.double().view(1).to(packed.device)]).tolist()
        out, sel, i = {}, [], 0
        for name, v in self._parts():
            part, i = vals[i : i + v.numel()], i + v.numel()
            if name == "selector":
                sel.append(part[0])
            else:
                out[name] = part if name == "acc" else part[0]
        out["blocks"], out["tokens"] = int(out["blocks"]), int(out["tokens"])
        return StepMetrics(**out, selector=dict(zip(self.selector, sel, strict=True)), grad_norm=norm)


def running_estimate(window: list[tuple[float, ...]]) -> tuple[float | None, float | None]:
    """``(accept_len_est, accept_len_est_uniform)`` over the window's ``(chain sum, blocks, walk tokens, walk
    steps)`` entries: the walk's tokens / steps (drafting.acceptance) and 1 + chains / blocks. A checkpoint
    written before the walk was counted has ``(chain sum, blocks)`` pairs: they count for the uniform mean only."""
    blocks = sum(e[1] for e in window)
    steps = sum(e[3] for e in window if len(e) > 3)
    walk = sum(e[2] for e in window if len(e) > 3) / steps if steps else None
    return walk, (1.0 + sum(e[0] for e in window) / blocks if blocks else None)
