"""Where the drafter's hidden states come from: ``HiddenStateSource``, chosen once at start, and its two kinds.

- ``ThreadedSource`` (one process, ``--launch single``): target thread(s) in this process, one per
  ``--target-gpus`` device, put micro-batches into one in-process ``HiddenStateQueue``; a stop is this
  process's signal.
- ``DistributedSource`` (a drafter worker of a multi-process run): its ``handoff.Receiver`` thread fills its
  queue from the target workers (NCCL for CUDA tensors, gloo for CPU ones); the launcher's ``stop`` and
  ``abort`` arrive on the control channel (runtime/device_worker.py's ``WorkerControl``); the replicas agree on the
  step to stop at and sum their step metrics (all-reduces).

The step loop (runtime/loop.py) asks its source, never which mode it runs in: for the queue (``start``),
whether to stop at a step boundary (``stop_now``) or give up a wait (``abort_check``) or a step
(``stop_mid_step``), for the step metrics summed over the replicas (``sum_metrics``), and at the end
(``stop_asked``, ``failed``, ``close``). ``setup`` builds the drafter (runtime/build.py) with what the
source needs beside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from trainer.runtime.common import gpu_uuid, log

if TYPE_CHECKING:  # imported where used: importing trainer.pipeline must not import torch (compile_cache)
    from trainer.runtime.hidden_queue import HiddenStateQueue


class HiddenStateSource(ABC):
    """The drafter's micro-batches, and what the replicas of a run agree on at step boundaries."""

    queue: HiddenStateQueue | None = None

    @abstractmethod
    def setup(self, build):
        """``(DrafterState, DrafterRole)``: the drafter built by ``build`` (a runtime.build.DrafterBuild),
        the first step warmed up, the queue's memory checked, the setup logged."""

    @abstractmethod
    def start(self, plan, cursor: int, end: int) -> HiddenStateQueue:
        """Start producing micro-batches ``cursor..end-1`` (this replica's share of them) into the queue it
        returns."""

    @abstractmethod
    def stop_asked(self) -> bool:
        """A stop was asked for (a signal to this process, or the launcher's stop to this worker)."""

    @abstractmethod
    def stop_now(self) -> bool:
        """At a step boundary: stop here? (replicas agree on it)"""

    @abstractmethod
    def abort_check(self) -> bool:
        """While waiting for a micro-batch: give up the wait (``HiddenStateQueue.get``'s ``should_stop``)."""

    def stop_mid_step(self) -> bool:
        """Between two micro-batches of a step: drop the step (rewound, not trained)."""
        return False

    def sum_metrics(self, packed):
        """A step's packed metrics (``StepMetrics.pack``) summed over the replicas."""
        return packed

    def failed(self) -> bool:
        """The run failed elsewhere (a worker died): the loop ends with exit status 1, after its save."""
        return False

    def close(self) -> None:
        """No more micro-batches: close the queue (its producers stop), join what this process runs."""
        if self.queue is not None:
            self.queue.close()


class ThreadedSource(HiddenStateSource):
    """One process: the target thread(s) and the in-process queue; ``stop`` is the process's StopControl,
    ``reporter`` the run's throughput reporter (it gets the queue's depth and the roles' meters)."""

    def __init__(self, args, devices, stop, reporter, log=log):
        self.args, self.devices, self.stop, self.reporter, self.log = args, devices, stop, reporter, log
        self.target_roles: list = []
        self.target_meters: list = []
        self.drafter_meter = None
        self.workers: list = []

    def setup(self, build):
        import torch

        from trainer.run.flags import check_devices
        from trainer.runtime.background import Background
        from trainer.runtime.gpu_meter import role_meter
        from trainer.runtime.hidden_queue import HiddenStateQueue, check_queue_memory, hidden_batch_bytes
        from trainer.runtime.roles import TargetRole, launch_lock
        from trainer.runtime.shared_head import head_from_target
        from trainer.runtime.startup_steps import begin_target_events, finish_target_events

        a, devices = self.args, self.devices
        check_devices(devices)
        tdtype = torch.bfloat16 if devices.target[0].startswith("cuda") else torch.float32
        # a target on the drafter's device in the head's dtype (cuda -> bf16, cpu -> fp32 on both sides):
        # the frozen head shares its embed_tokens / norm / lm_head instead of reading them again
        share = next((d for d in devices.target if d == build.device), None)
        loads = []

        def load_targets(cfg) -> Background:  # read in a thread beside the drafter's head, resume and compile
            # built here, on this thread: a build beside a compile can come out partly fp32 (loading.BuiltModel)
            pending = [
                begin_target_events(build.startup, a, d, tdtype, cfg.target_layer_ids) for d in devices.target
            ]
            loads.append(
                Background(lambda: [finish_target_events(build.startup, p) for p in pending], "load-target")
            )
            return loads[-1]

        st = build.state(defer_head=share is not None, beside=load_targets)
        self.target_meters = [role_meter(d, "target", gpu_uuid(d)) for d in devices.target]
        lock = launch_lock(devices)  # target threads and the drafter in this one process
        build.warm_up(st, lock, tdtype)  # the drafter's first step compiles now, while the target loads
        models = loads[0].result()
        for d, m, model in zip(devices.target, self.target_meters, models, strict=True):
            if d == share and st.head is None:
                st.head = head_from_target(a.target_model, model, d, st.head_dtype)
            self.target_roles.append(
                TargetRole(model, d, st.cfg.target_layer_ids, a.use_soft_labels, m, lock=lock)
            )
        self.drafter_meter = role_meter(build.device, "drafter", gpu_uuid(build.device))
        role = build.role(st, self.drafter_meter, lock=lock)
        self.queue = HiddenStateQueue(a.hs_queue_depth, start=st.cursor)
        per = hidden_batch_bytes(a, st.cfg, 2 if tdtype == torch.bfloat16 else 4)
        for d in devices.target:  # the queued batches live on the target's device until taken
            self.log(check_queue_memory(d, self.queue.capacity, len(self.target_roles), per, a))
        build.log_setup(st)
        return st, role

    def start(self, plan, cursor: int, end: int) -> HiddenStateQueue:
        from trainer.runtime.roles import TargetWorker

        q, n = self.queue, len(self.target_roles)
        self.workers = [TargetWorker(r, plan, i, n, cursor, end, q) for i, r in enumerate(self.target_roles)]
        self.reporter.queue_stats = lambda: (q.depth(), q.capacity)
        self.reporter.meters.extend([*self.target_meters, self.drafter_meter])
        for w in self.workers:
            w.start()
        return q

    def stop_asked(self) -> bool:
        return self.stop.requested

    def stop_now(self) -> bool:
        return self.stop.requested

    def abort_check(self) -> bool:
        return self.stop.requested

    def stop_mid_step(self) -> bool:
        return self.stop.requested

    def close(self) -> None:
        super().close()
        for w in self.workers:
            w.join(timeout=60)


class DistributedSource(HiddenStateSource):
    """Drafter replica ``di`` of a multi-process run on ``device``: its receiver, the stop agreement and the
    metric sum. ``ctl``: the worker's control flags (runtime/device_worker.py ``WorkerControl``); ``group``: the
    drafter replicas' process group (DDP, the metric sum), ``ctrl_group`` their gloo group (the stop
    agreement); ``meter``: the drafter's meter (its role counts into it)."""

    def __init__(self, args, devices, layout, di: int, device: str, ctl, group, ctrl_group, meter, log=log):
        self.args, self.devices, self.layout, self.di, self.device = args, devices, layout, di, device
        self.ctl, self.group, self.ctrl_group, self.meter, self.log = ctl, group, ctrl_group, meter, log
        self.stopped = False

    def setup(self, build):
        import torch

        from trainer.runtime.hidden_queue import check_queue_memory, hidden_batch_bytes

        a, device = self.args, self.device
        st = build.state()
        ddp = None
        if self.layout.ND > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ddp = DDP(
                st.drafter,
                process_group=self.group,
                device_ids=[torch.device(device).index] if device.startswith("cuda") else None,
            )
        role = build.role(st, self.meter, ddp)
        # the first step's compile while the targets load in their processes (the capture's dtype)
        build.warm_up(
            st, None, torch.bfloat16 if self.devices.target[0].startswith("cuda") else torch.float32
        )
        per = hidden_batch_bytes(a, st.cfg, 2 if device.startswith("cuda") else 4)
        self.log(check_queue_memory(device, a.hs_queue_depth, 1, per, a))
        build.log_setup(st)
        return st, role

    def start(self, plan, cursor: int, end: int) -> HiddenStateQueue:
        """The receiver thread and the queue it fills: this replica takes cursor + di, + ND, ..."""
        from trainer.runtime.handoff import Receiver
        from trainer.runtime.hidden_queue import HiddenStateQueue

        self.queue = HiddenStateQueue(self.args.hs_queue_depth, start=cursor + self.di, stride=self.layout.ND)
        Receiver(self.layout, self.di, plan, cursor, end, self.queue, self.device).start()
        return self.queue

    def stop_asked(self) -> bool:
        return self.stopped

    def stop_now(self) -> bool:
        """Stop if any replica was told to (all replicas get the same answer)."""
        import torch
        import torch.distributed as dist

        local = int(self.ctl.stop or self.ctl.abort)
        if self.layout.ND > 1:
            t = torch.tensor([local], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl_group)
            local = int(t.item())
        if local and not self.stopped:
            self.stopped = True
            if self.di == 0:
                self.ctl.ch.send("stopping")
        return self.stopped

    def abort_check(self) -> bool:
        return self.ctl.abort

    def sum_metrics(self, packed):
        import torch.distributed as dist

        if self.layout.ND > 1:
            dist.all_reduce(packed, group=self.group)
        return packed

    def failed(self) -> bool:
        return self.ctl.abort
