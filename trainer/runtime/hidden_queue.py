"""The hidden-state queue between the target side and the drafter, in both pipeline modes, and its memory.

``HiddenBatch``: one micro-batch's captured hidden states (and the final hidden state for soft labels) with
its token ids, loss mask and document ids: what the target role hands the drafter role.

``HiddenStateQueue(capacity, start, stride=1)``: bounded and ordered. The drafter takes micro-batches
``start, start + stride, start + 2 * stride, ...`` with ``get(g)``, in that order, whatever order its
producers finish them in. A producer hands batch ``g`` over with ``put`` once ``g`` is among the next
``capacity`` batches the drafter will take (``reserve(g)`` waits for that right alone: the drafter worker's
receiver takes it before it allocates and posts a receive). So at most ``capacity`` batches wait in the queue
(``depth()``), the batch the drafter needs next always gets in (no deadlock, however many producers), and
``capacity`` is exactly ``--hs-queue-depth``:
- one process (``runtime.loop.Trainer``): one ``TargetWorker`` thread per target device puts every
  ``n``-th micro-batch (``stride`` 1); the batches wait on their target's device;
- a drafter worker (``runtime.handoff.Receiver``): one receiver thread puts this replica's micro-batches
  (``stride`` = the number of drafter replicas); the batches wait on the drafter's device.
A producer that fails hands its error over with ``fail(g, ...)`` at the batch it owed; the drafter raises it
when it reaches that batch. ``close()`` stops both sides (``Stopped``).

``check_queue_memory`` computes the queue's memory at start (``capacity`` batches of ``--token-budget``
tokens, plus the ones producers or the drafter hold) and refuses a depth that cannot fit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from trainer.run.flags import FlagError


@dataclass
class HiddenBatch:
    index: int  # global micro-batch index
    epoch: int
    tokens: int
    hidden: torch.Tensor  # (1, T, n*H) on the target's device
    final: torch.Tensor | None  # (1, T, H) last_hidden_state, only for soft labels
    input_ids: torch.Tensor  # (1, T) on the target's device
    loss_mask: torch.Tensor  # (1, T) bool, on the CPU
    doc_ids: torch.Tensor  # (1, T), on the CPU
    # a CUDA event the hidden states are complete after (launched, or received point-to-point)
    ready: object = None


class Stopped(Exception):
    """Raised by queue operations once the pipeline is stopping."""


@dataclass
class _Failure:
    index: int  # the batch its producer owed
    exc: BaseException
    message: str
    grace_s: float


class HiddenStateQueue:
    def __init__(self, capacity: int, start: int, stride: int = 1):
        if capacity < 1 or stride < 1:
            raise ValueError(f"capacity and stride must be >= 1, got {capacity} and {stride}")
        self.capacity, self.stride = capacity, stride
        self._next = start  # the batch the drafter takes next
        self._items: dict[int, HiddenBatch] = {}
        self._failure: _Failure | None = None
        self._cond = threading.Condition()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self) -> int:
        """Batches waiting to be taken."""
        return len(self._items)

    def _admits(self, g: int) -> bool:
        return (g - self._next) // self.stride < self.capacity

    def reserve(self, g: int) -> None:
        """Wait until batch ``g`` may enter (one of the next ``capacity`` the drafter takes)."""
        with self._cond:
            while not self._closed and not self._admits(g):
                self._cond.wait(0.1)
            if self._closed:
                raise Stopped

    def put(self, item: HiddenBatch) -> None:
        with self._cond:
            while not self._closed and not self._admits(item.index):
                self._cond.wait(0.1)
            if self._closed:
                raise Stopped
            self._items[item.index] = item
            self._cond.notify_all()

    def fail(self, g: int, exc: BaseException, message: str, grace_s: float = 0.0) -> None:
        """A producer failed before batch ``g``: ``get(g)`` raises ``RuntimeError(message: exc)``, after up
        to ``grace_s`` seconds in which its ``should_stop`` may turn true instead (then: ``Stopped``)."""
        with self._cond:
            if self._failure is None or g < self._failure.index:
                self._failure = _Failure(g, exc, message, grace_s)
            self._cond.notify_all()

    def get(self, g: int, should_stop=lambda: False) -> HiddenBatch:
        with self._cond:
            if g != self._next:
                raise RuntimeError(
                    f"hidden-state queue out of order: expected micro-batch {self._next}, asked for {g}"
                )
            while True:
                if self._closed or should_stop():
                    raise Stopped
                item = self._items.pop(g, None)
                if item is not None:
                    self._next = g + self.stride
                    self._cond.notify_all()
                    return item
                failure = self._failure
                if failure is not None and failure.index <= g:
                    break
                self._cond.wait(0.05)
        end = time.monotonic() + failure.grace_s
        while time.monotonic() < end:
            if should_stop():
                raise Stopped
            time.sleep(0.05)
        raise RuntimeError(f"{failure.message}: {failure.exc!r}") from failure.exc

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


# -- memory ------------------------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def hidden_batch_bytes(args, cfg, elem_size: int) -> int:
    """Bytes of the largest hidden-state batch: ``--token-budget`` tokens x captured width (+ final)."""
    per_token = cfg.num_captured * cfg.hidden_size + (cfg.hidden_size if args.use_soft_labels else 0)
    return int(args.token_budget) * per_token * elem_size


def keep_free_bytes(total: int) -> int:
    """GPU memory the queue leaves for the drafter's (or target's) own work: a quarter, at least 8 GiB."""
    return max(total // 4, 8 << 30)


def queue_refusal(
    device: str, batches: int, in_use: int, per_batch: int, free: int, total: int
) -> str | None:
    """Why ``batches`` (+``in_use``) hidden-state batches cannot wait on a GPU with ``free`` of ``total`` bytes
    free, naming the depth that fits; None when they fit."""
    need = (batches + in_use) * per_batch
    room = free - keep_free_bytes(total)
    if need <= room:
        return None
    fits = max(0, room // per_batch - in_use)
    return (
        f"{batches} batches of up to {fmt_bytes(per_batch)} (+{in_use} in use) need {fmt_bytes(need)} on "
        f"{device}, which has {fmt_bytes(free)} free of {fmt_bytes(total)} and keeps "
        f"{fmt_bytes(keep_free_bytes(total))} for training: use --hs-queue-depth {fits} or less"
        + (" (or a smaller --token-budget)" if fits < 2 else "")
    )


def check_queue_memory(device: str, batches: int, in_use: int, per_batch: int, args) -> str:
    """A start-up log line with the queue's memory on ``device``; FlagError when it cannot fit."""
    need = (batches + in_use) * per_batch
    what = (
        f"hidden-state queue on {device}: {batches} x {fmt_bytes(per_batch)} (+{in_use} in use) = "
        f"{fmt_bytes(need)} (--token-budget {args.token_budget} tokens per batch)"
    )
    if not device.startswith("cuda"):
        return what
    free, total = torch.cuda.mem_get_info(torch.device(device))
    why = queue_refusal(device, batches, in_use, per_batch, free, total)
    if why:
        raise FlagError("--hs-queue-depth", why)
    return f"{what}; {fmt_bytes(free)} free of {fmt_bytes(total)}"
