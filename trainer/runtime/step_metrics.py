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

    def pack(self) -> Any:
        """One float64 vector: the selector's sums, loss, chain, walk tokens, walk steps, acc..., accept_len,
        blocks, tokens (what the all-reduce sums)."""
        import torch

        scalars = (self.loss, self.chain_sum, self.walk_tokens, self.walk_steps)
        return torch.cat(
            [*self.selector.values(), *scalars, self.acc, self.accept_len, self.blocks, self.tokens]
        )

    def unpack(self, packed, grad_norm) -> StepMetrics:
        """``packed`` (this one's ``pack``, summed over the replicas) and the step's gradient norm read back
        together (the step's one host sync), as floats in this one's layout."""
        import torch

        *vals, norm = torch.cat([packed, grad_norm.double().view(1).to(packed.device)]).tolist()
        names = list(self.selector)
        sel, vals = vals[: len(names)], vals[len(names) :]
        n_acc = len(vals) - 7
        acc, rest = vals[4 : 4 + n_acc], vals[4 + n_acc :]
        return StepMetrics(
            loss=vals[0],
            chain_sum=vals[1],
            walk_tokens=vals[2],
            walk_steps=vals[3],
            acc=acc,
            accept_len=rest[0],
            blocks=int(rest[1]),
            tokens=int(rest[2]),
            selector=dict(zip(names, sel, strict=True)),
            grad_norm=norm,
        )


def running_estimate(window: list[tuple[float, ...]]) -> tuple[float | None, float | None]:
    """``(accept_len_est, accept_len_est_uniform)`` over the window's ``(chain sum, blocks, walk tokens, walk
    steps)`` entries: the walk's tokens / steps (drafting.acceptance) and 1 + chains / blocks. A checkpoint
    written before the walk was counted has ``(chain sum, blocks)`` pairs: they count for the uniform mean only."""
    blocks = sum(e[1] for e in window)
    steps = sum(e[3] for e in window if len(e) > 3)
    walk = sum(e[2] for e in window if len(e) > 3) / steps if steps else None
    return walk, (1.0 + sum(e[0] for e in window) / blocks if blocks else None)
