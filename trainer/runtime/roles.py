"""The two roles of the pipeline, and the thread that runs a target role into the hidden-state queue.

- ``TargetRole``: the frozen target on one device; ``role(micro_batch) -> HiddenBatch`` (captured hidden
  states, plus the final hidden state for soft labels); ``role.run(plan, gs)`` yields them one behind the
  GPU, with no idle gap between micro-batches. ``TargetWorker`` runs one in a thread, producing every
  ``n``-th micro-batch of the stream into the ``HiddenStateQueue`` (``runtime.hidden_queue``: bounded by
  ``--hs-queue-depth`` over all target workers; the drafter takes the batches in data order whatever the
  threads' timing, which is what makes resume exact).
- ``DrafterRole``: anchors, feature noise, drafter forward, DFlash loss and backward per micro-batch;
  clipping and the AdamW step per optimizer step. It owns the generator for anchors and noise (reseeded
  per micro-batch by the caller). With ``est_anchors`` M > 0 it also draws M *measuring* anchors per row, one
  run of M consecutive candidates, from a second generator seeded from the same micro-batch seed, and runs
  them after the training blocks in the same drafter forward: they carry no loss weight (``dflash_loss``'s
  ``n_train``) and the acceptance walk (``accept_len_est``) reads only them (docs/evaluate.md). With
  ``est_holdout`` the row's last document is a held-out one (``data.dataset.Plan``): the measuring run is drawn
  there and the training anchors everywhere else. With ``ddp`` (a DistributedDataParallel wrapper of the drafter) the
  forward goes through it and the gradient is averaged over the replicas on the step's last micro-batch.

``launch_lock(devices)``: in one process (target threads beside the drafter) the roles take turns with a lock
while they *launch* GPU work: torch.compile is not thread-safe (a thread calling compiled code while another
compiles fails: "Detected that you are using FX to symbolically trace a dynamo-optimized function"), and any
call may recompile. Launches do not wait for the GPU, so the GPU still runs both roles' queued work back to
back; nothing inside the lock syncs with the device.

The roles only meet through ``HiddenBatch`` objects, so a multi-process pipeline puts them in different
processes, with point-to-point transfers (``runtime.handoff``) into the drafter's queue.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from trainer.data.dataset import MicroBatch, Plan
from trainer.drafting.loss import dflash_loss
from trainer.drafting.masks import anchor_count, sample_anchors, sample_run
from trainer.drafting.selector import selector_loss
from trainer.run.rundir import RoleMeter
from trainer.runtime.hidden_queue import HiddenBatch, HiddenStateQueue, Stopped
from trainer.target.capture import capture
from trainer.thread_names import name_this_thread


class TargetRole:
    def __init__(
        self,
        model,
        device: str,
        layer_ids: list[int],
        need_final: bool,
        meter: RoleMeter,
        lock: contextlib.AbstractContextManager | None = None,
    ):
        self.model, self.device, self.layer_ids, self.need_final, self.meter = (
            model,
            device,
            layer_ids,
            need_final,
            meter,
        )
        self.lock = lock if lock is not None else contextlib.nullcontext()

    def launch(self, mb: MicroBatch) -> HiddenBatch:
        """Queue the capture of ``mb`` on the current stream and return at once: on CUDA the hidden states are
        complete after ``ready`` (an event), which nothing has waited for yet."""
        self.meter.begin()
        ids_cpu, lm, docs, _pos = mb.to_tensors(
            "cpu"
        )  # doc ids stay on the host: no device sync to read them
        ids = ids_cpu.to(self.device)
        with self.lock:  # compiled code: one role at a time in a process (see launch_lock)
            hidden, final = capture(self.model, ids, docs, self.layer_ids, need_final_hidden=self.need_final)
        ready = None
        if self.device.startswith("cuda"):
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self.meter.end(mb.num_tokens)
        return HiddenBatch(mb.index, mb.epoch, mb.num_tokens, hidden, final, ids, lm, docs, ready=ready)

    def __call__(self, mb: MicroBatch) -> HiddenBatch:
        """One complete micro-batch (the host waits for it)."""
        hb = self.launch(mb)
        if hb.ready is not None:
            hb.ready.synchronize()
        return hb

    def run(self, plan: Plan, gs) -> Iterator[HiddenBatch]:
        """Micro-batches ``gs`` of ``plan`` in order, each complete when it is yielded, with the next one already
        launched: the GPU works on ``g + 1`` while the host hands ``g`` on and packs ``g + 2``, so it never waits
        for the host between micro-batches (what a sync per micro-batch costs), and the host is at most one
        micro-batch ahead of it."""
        prev = None
        for g in gs:
            hb = self.launch(plan.batch(g))
            if hb.ready is None:  # computed in the call (CPU): nothing to overlap
                yield hb
                continue
            if prev is not None:
                prev.ready.synchronize()
                yield prev
            prev = hb
        if prev is not None:
            prev.ready.synchronize()
            yield prev


def launch_lock(devices) -> contextlib.AbstractContextManager | None:
    """The lock the roles of one process share when any of them runs on CUDA (where they compile); None on CPU
    (nothing is compiled there, and CPU roles compute inside the call: a lock would serialise them)."""
    return (
        threading.Lock()
        if any(str(d).startswith("cuda") for d in [*devices.target, *devices.drafter])
        else None
    )


class TargetWorker(threading.Thread):
    """Produces micro-batches start+lane, start+lane+lanes, ... < end into the queue."""

    def __init__(
        self, role: TargetRole, plan: Plan, lane: int, lanes: int, start: int, end: int, q: HiddenStateQueue
    ):
        super().__init__(name=f"dflash-target-{lane}", daemon=True)
        self.role, self.plan, self.lane, self.lanes, self.start_g, self.end_g, self.q = (
            role,
            plan,
            lane,
            lanes,
            start,
            end,
            q,
        )

    def run(self) -> None:
        name_this_thread()
        first = self.start_g + (self.lane - self.start_g) % self.lanes
        owed = first  # the micro-batch this worker hands over next
        try:
            for hb in self.role.run(self.plan, range(first, self.end_g, self.lanes)):
                if self.q.closed:
                    return
                self.q.put(hb)
                owed = hb.index + self.lanes
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the drafter, which reports it
            self.q.fail(owed, e, "target worker failed")


EST_SEED_SALT = 0x5EED_E57A  # the measuring generator's seed: the micro-batch's seed XOR this


def add_noise(h: torch.Tensor, scale: float, kind: str, generator: torch.Generator) -> torch.Tensor:
    if scale <= 0:
        return h
    if kind == "uniform":
        n = torch.rand(h.shape, generator=generator, device=h.device, dtype=torch.float32).mul_(2).sub_(1)
    else:
        n = torch.randn(h.shape, generator=generator, device=h.device, dtype=torch.float32)
    return h + (n * scale).to(h.dtype)


class DrafterRole:
    def __init__(
        self,
        drafter,
        head,
        optimizer,
        *,
        device: str,
        block_size: int,
        max_anchors: int,
        gamma: float,
        noise_type: str,
        grad_clip: float,
        generator: torch.Generator,
        meter: RoleMeter,
        ddp=None,
        lock: contextlib.AbstractContextManager | None = None,
        anchor_run: int = 1,
        est_anchors: int = 0,
        est_holdout: bool = False,
        selector_unary_grad: bool = False,
        objective: str | None = None,
    ):
        # the loss's objective (drafting.loss.OBJECTIVES; None: kl where the target's final hidden state
        # comes with the batch, else data)
        self.objective = objective
        self.drafter, self.head, self.optimizer, self.ddp = drafter, head, optimizer, ddp
        self.anchor_run = (
            anchor_run  # anchors in runs of this many consecutive candidates (masks.sample_anchors)
        )
        if est_anchors < 0 or est_anchors == 1:
            raise ValueError(f"est_anchors must be 0 (off) or >= 2, got {est_anchors}")
        # measuring blocks per row: one run of this many consecutive anchors beside the training ones, drawn
        # by their own generator (the training anchors and noise draw exactly as without them)
        self.est_anchors = est_anchors
        # the row's last document is held out (data.dataset.Plan): measured there, never trained on
        if est_holdout and not est_anchors:
            raise ValueError("est_holdout needs est_anchors >= 2 (the held-out document is only measured)")
        self.est_holdout = est_holdout
        # DFlash 2: the selector's loss also reaches the drafter through the unary logits (selector_loss)
        self.selector_unary_grad = selector_unary_grad
        self.est_generator = torch.Generator(device=generator.device) if est_anchors else None
        self.device, self.block_size, self.max_anchors, self.gamma = device, block_size, max_anchors, gamma
        self.noise_type, self.grad_clip, self.generator, self.meter = noise_type, grad_clip, generator, meter
        self.attn_impl = "flex" if device.startswith("cuda") else "sdpa"
        self.params = [p for p in drafter.parameters() if p.requires_grad]
        self.lock = lock if lock is not None else contextlib.nullcontext()

    def _autocast(self):
        if self.device.startswith("cuda"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def micro_step(
        self,
        hb: HiddenBatch,
        noise: float,
        loss_scale: float,
        poison: bool = False,
        seed: int | None = None,
        sync: bool = True,
    ) -> dict:
        """Forward + backward of one micro-batch; returns detached metric tensors (no host sync).
        ``seed`` reseeds the anchor/noise generator first; ``sync=False`` skips DDP's gradient all-reduce."""
        with self.lock:  # compiled code (forward, and the backward's first compile): one role at a time
            return self._micro_step(hb, noise, loss_scale, poison, seed, sync)

    def _micro_step(self, hb, noise, loss_scale, poison, seed, sync) -> dict:
        dev = self.device
        if hb.ready is not None:  # made on another stream: wait for it, tell the allocator
            torch.cuda.current_stream().wait_event(hb.ready)
            hb.hidden.record_stream(torch.cuda.current_stream())
            if hb.final is not None:
                hb.final.record_stream(torch.cuda.current_stream())
        self.meter.begin()  # after the wait: a late hand-off is not the drafter's busy time
        if seed is not None:
            self.generator.manual_seed(seed)
        ids, lm, docs = hb.input_ids.to(dev), hb.loss_mask.to(dev), hb.doc_ids.to(dev)
        train_lm, est_lm = self._masks(hb.loss_mask, hb.doc_ids)  # host copies
        lm, lm_est = self._masks(lm, docs)  # the same on the device (no copy, no sync)
        hidden = add_noise(hb.hidden.to(dev), noise, self.noise_type, self.generator)
        final = hb.final.to(dev) if hb.final is not None else None
        A = anchor_count(hb.doc_ids, train_lm, self.block_size, self.max_anchors)  # host copies: no sync
        anchors = sample_anchors(
            docs,
            lm,
            self.block_size,
            self.max_anchors,
            self.generator,
            num_anchors=A,
            run_length=self.anchor_run,
        )
        n_train = anchors.shape[1]
        if self.est_anchors:
            anchors = torch.cat(
                [anchors, self._measuring_anchors(hb.doc_ids, est_lm, docs, lm_est, seed)], dim=1
            )
        fwd = self.ddp if self.ddp is not None else self.drafter
        no_sync = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
        with no_sync:
            with self._autocast():
                out = fwd(hidden, ids, docs, anchors, self.head.embed_tokens, attn_impl=self.attn_impl)
                selector = getattr(self.drafter, "candidate_selector", None)
                loss, metrics = dflash_loss(
                    out,
                    self.head,
                    ids,
                    anchors,
                    self.gamma,
                    target_final_hidden=final,
                    topk=selector.top_k if selector is not None else 0,
                    n_train=n_train,
                    objective=self.objective,
                )
                # DFlash 2: its selector's loss, added with weight 1 (drafting.selector), labelled as the loss
                # judges acceptance: the target's argmax with soft labels, else the data token
                if selector is not None:
                    cands = (metrics.pop("topk_ids"), metrics.pop("topk_values"))  # from the loss's logits
                    sel, sel_metrics = selector_loss(
                        out,
                        selector,
                        self.head.lm_head.weight,
                        ids,
                        anchors,
                        self.gamma,
                        candidates=cands,
                        labels=metrics.pop("label_ids"),
                        n_train=n_train,
                        unary_grad=self.selector_unary_grad,
                    )
                    loss = loss + sel
                    metrics = {**metrics, "selector_loss": sel.detach(), **sel_metrics}
            if poison:  # a test's diverging run (Trainer.poisoned): a NaN loss, as a diverging run gives
                loss = loss * float("nan")
            (loss * loss_scale).backward()
        self.meter.end(hb.tokens)  # on CUDA: an event, no host sync (runtime.gpu_meter)
        return {"loss": loss.detach(), **metrics}

    def _masks(self, loss_mask: torch.Tensor, doc_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss mask the training anchors are drawn from, the one the measuring run is drawn from): both the
        row's own, or with ``est_holdout`` the others' tokens for training and its last document's (the largest
        doc id: the held-out sequence) for measuring."""
        if not self.est_holdout:
            return loss_mask, loss_mask
        held = doc_ids == doc_ids.amax(dim=1, keepdim=True)
        return loss_mask & ~held, loss_mask & held

    def _measuring_anchors(self, doc_ids, est_lm, docs, lm_est, seed) -> torch.Tensor:
        """``(B, M')``: one run of ``est_anchors`` consecutive candidates of the measuring mask per row (sorted,
        ``-1`` padding where a row has fewer; ``doc_ids`` / ``est_lm`` on the host, ``docs`` / ``lm_est`` on the
        device), from the measuring generator, reseeded from ``seed`` alone (exact resume)."""
        if seed is not None:
            self.est_generator.manual_seed(seed ^ EST_SEED_SALT)
        M = self.est_anchors
        n = anchor_count(doc_ids, est_lm, self.block_size, M)  # host copies: no sync
        return sample_run(docs, lm_est, self.block_size, M, self.est_generator, num_anchors=n)

    def clip(self) -> torch.Tensor:
        """Clip the accumulated gradient to ``grad_clip`` (0: measure only); returns its norm (a tensor)."""
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        self.meter.begin()  # clip and the AdamW step are the drafter's busy time too (no tokens)
        with self.lock:
            return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def apply(self, lr: float) -> None:
        """The AdamW step at ``lr``, then clear the gradient."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        with self.lock:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.meter.end(0)

    def discard(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.meter.end(0)  # a span clip began, if any
