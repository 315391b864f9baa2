"""Hidden states from target workers to drafter workers over torch.distributed.

Ranks (``Layout``): on every node, local ranks ``0 .. T-1`` are target workers (``--target-gpus``), then
``T .. T+D-1`` drafter workers (``--drafter-gpus``). Globally target ``ti = node * T + i``, drafter
``di = node * D + j``. From the start cursor ``s0``, micro-batch ``g`` is produced by target
``(g - s0) % NT`` and trained by drafter replica ``(g - s0) % ND`` (round-robin over both).

Per micro-batch the target sends a header ``[g, T, C, final width or 0, dtype]`` (a CPU tensor: gloo) then the
packed hidden states ``(1, T, C)`` (and the final hidden state for soft labels) with ``isend`` (NCCL on
GPU: device to device; gloo on CPU). Each drafter runs a ``Receiver`` thread that reserves a place in its
``HiddenStateQueue`` (``runtime.hidden_queue``, capacity ``--hs-queue-depth``) before it posts the next
receive, so at most that many batches wait on the drafter's device (plus the one being trained); a full
queue stalls the target's sends, which stalls the target: back-pressure without any host round trip.
Token ids, loss mask and document ids are not sent: every worker packs the same micro-batch ``g`` from its
own copy of the data.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch
import torch.distributed as dist

from trainer.data.dataset import Plan
from trainer.runtime.hidden_queue import HiddenBatch, HiddenStateQueue, Stopped
from trainer.thread_names import name_this_thread

PEER_GRACE_S = (
    10.0  # how long a failed receive waits for the launcher's abort before it is an error of its own
)
MAX_PENDING_SENDS = 2  # hidden-state batches a target may have in flight (on its own device)
_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class Layout:
    """Which rank does what: ``T`` target and ``D`` drafter workers on each of ``nnodes`` nodes."""

    def __init__(self, targets_per_node: int, drafters_per_node: int, nnodes: int):
        self.T, self.D, self.nnodes = targets_per_node, drafters_per_node, nnodes
        self.per_node = self.T + self.D
        self.world = self.per_node * nnodes
        self.NT, self.ND = self.T * nnodes, self.D * nnodes

    def role_of(self, rank: int) -> tuple[str, int, int]:
        """(role, global index among that role, local index into the node's device list)."""
        node, local = divmod(rank, self.per_node)
        if local < self.T:
            return "target", node * self.T + local, local
        return "drafter", node * self.D + local - self.T, local - self.T

    def target_rank(self, ti: int) -> int:
        return (ti // self.T) * self.per_node + ti % self.T

    def drafter_rank(self, di: int) -> int:
        return (di // self.D) * self.per_node + self.T + di % self.D

    @property
    def drafter_ranks(self) -> list[int]:
        return [self.drafter_rank(d) for d in range(self.ND)]


def _wait(work, should_stop, poll: bool) -> bool:
    """Wait for a send; False if ``should_stop`` turned true first. NCCL work is polled (``wait`` would only
    order streams); gloo's send work completes in ``wait`` alone."""
    if not poll:
        work.wait()
        return True
    while not work.is_completed():
        if should_stop():
            return False
        time.sleep(0.0005)
    work.wait()
    return True


def run_sender(layout: Layout, ti: int, role, plan: Plan, s0: int, end: int, should_stop) -> int:
    """Target worker ``ti``: produce its micro-batches and send each to its drafter; returns how many.
    ``role.run`` yields each batch complete with the next one already computing; the sends go on a stream of
    their own, so NCCL does not wait for that next capture before it moves this one."""
    pending: list[tuple[list, HiddenBatch]] = []
    sent = 0
    send_stream = torch.cuda.Stream(role.device) if str(role.device).startswith("cuda") else None
    for hb in role.run(plan, range(s0 + ti, end, layout.NT)):
        if should_stop():
            break
        g = hb.index
        dst = layout.drafter_rank((g - s0) % layout.ND)
        fw = hb.final.shape[-1] if hb.final is not None else 0
        hdr = torch.tensor(
            [g, hb.hidden.shape[1], hb.hidden.shape[2], fw, _DTYPES.index(hb.hidden.dtype)], dtype=torch.int64
        )
        dist.send(hdr, dst)
        with torch.cuda.stream(send_stream) if send_stream is not None else contextlib.nullcontext():
            works = [dist.isend(hb.hidden.contiguous(), dst)]
            if fw:
                works.append(dist.isend(hb.final.contiguous(), dst))
        pending.append((works, hb))
        sent += 1
        while len(pending) > MAX_PENDING_SENDS or (pending and not hb.hidden.is_cuda):
            for w in pending.pop(0)[0]:
                if not _wait(w, should_stop, hb.hidden.is_cuda):
                    return sent
    for works, hb in pending:
        for w in works:
            if not _wait(w, should_stop, hb.hidden.is_cuda):
                return sent
    return sent


class Receiver(threading.Thread):
    """Drafter replica ``di``: receives its micro-batches in order into its bounded queue on its device."""

    def __init__(
        self, layout: Layout, di: int, plan: Plan, s0: int, end: int, q: HiddenStateQueue, device: str
    ):
        super().__init__(name=f"dflash-recv-{di}", daemon=True)
        self.layout, self.di, self.plan, self.s0, self.end, self.device = layout, di, plan, s0, end, device
        self.q = q

    def _recv(self, shape, dtype, src):
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        dist.irecv(buf, src).wait()  # CUDA: the receiving stream waits for NCCL, the host does not
        return buf

    def run(self) -> None:
        name_this_thread()
        cuda = self.device.startswith("cuda")
        stream = None
        L = self.layout
        if cuda:
            torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device)
        g = self.s0 + self.di  # the micro-batch this receiver hands over next
        try:
            for g in range(self.s0 + self.di, self.end, L.ND):
                self.q.reserve(g)  # a place in the queue before the receive allocates on the device
                src = L.target_rank((g - self.s0) % L.NT)
                hdr = torch.empty(5, dtype=torch.int64)
                dist.recv(hdr, src)
                g2, T, C, fw, code = hdr.tolist()
                mb = self.plan.batch(g)
                if g2 != g or mb.num_tokens != T:
                    raise RuntimeError(
                        f"hidden-state hand-off out of order: expected micro-batch {g} "
                        f"({mb.num_tokens} tokens) from rank {src}, got {g2} ({T} tokens)"
                    )
                dtype = _DTYPES[code]
                ready = None
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    hidden = self._recv((1, T, C), dtype, src)
                    final = self._recv((1, T, fw), dtype, src) if fw else None
                    if cuda:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                ids, lm, docs, _pos = mb.to_tensors("cpu")
                self.q.put(HiddenBatch(g, mb.epoch, T, hidden, final, ids, lm, docs, ready=ready))
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the training loop, which reports it
            if not self.q.closed:
                # a target that died shows here first; the launcher's abort, naming it, follows in a moment
                self.q.fail(g, e, "receiving hidden states failed", grace_s=PEER_GRACE_S)
