"""``python -m trainer.worker --settings JSON | FLAGS``: one target or drafter worker of a multi-process run.

Started by the launcher (``runtime.launcher``, one per device, with its resolved settings as JSON:
``trainer.run.settings.worker_argv``) or by ``torchrun`` across nodes (the run's flags, resolved here), with
the torch.distributed environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), ``DFLASH_CONTROL=host:port`` (the launcher's control socket) and its
secret (``DFLASH_CONTROL_SECRET``, else ``RUN/control.secret``: runtime/control_channel.py). Its
role and device come from its rank (``runtime.handoff.Layout``). NCCL for CUDA tensors, gloo for CPU ones.

A worker dies with its launcher: ``PR_SET_PDEATHSIG`` (SIGKILL when the parent dies), a watchdog on the
parent pid, and the end of the control connection. It ignores SIGINT/SIGTERM (the launcher owns the stop
protocol). Metrics go to the launcher (``meter`` every 0.25 s; the saving drafter's step records and
checkpoint events); log lines go to stdout with a ``[role index device]`` prefix.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

from trainer.data.dataset import DataError
from trainer.run.flags import FlagError, check_devices
from trainer.run.settings import parse_worker_argv, resolve
from trainer.run.startup import StartupEvents
from trainer.runtime.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    Logger,
    draft_config,
    gpu_uuid,
    node_name,
    quiet_transformers,
    total_steps_of,
)
from trainer.runtime.loop import Trainer
from trainer.thread_names import name_this_thread, named

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (and exit now if it already has)."""
    parent = int(os.environ.get("DFLASH_LAUNCHER_PID", "0")) or os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=named(watch), name="dflash-parent-watch", daemon=True).start()


def finish(code: int) -> None:
    """Exit at once (threads may sit in blocking receives): flush first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class WorkerControl:
    """This worker's end of the control channel: flags set by the launcher's messages."""

    def __init__(self, channel, role: str):
        self.ch, self.role = channel, role
        self.stop = self.abort = self.exit = False
        self.saver = 0
        self.welcome: dict | None = None
        self._welcome_evt = threading.Event()
        self.on_abort = None

    def start(self) -> None:
        threading.Thread(target=named(self._read), name="dflash-control", daemon=True).start()

    def _read(self) -> None:
        for msg in self.ch:
            op = msg.get("op")
            if op == "welcome":
                self.welcome = msg
                self.stop = bool(msg.get("stop"))
                self._welcome_evt.set()
            elif op == "stop":
                self.stop = True
            elif op == "exit":
                self.exit = True
                if self.role == "target":  # nothing to save; it may sit in a send nobody will receive
                    finish(0)
            elif op == "abort":
                self.saver = int(msg.get("saver", 0))
                self.abort = True
                if self.role == "target":
                    finish(1)
                if self.on_abort is not None:
                    self.on_abort(self.saver)
        finish(1)  # the launcher is gone

    def wait_abort(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.abort and time.monotonic() < end:
            time.sleep(0.05)
        return self.abort

    def wait_welcome(self, timeout: float = 600) -> dict:
        if not self._welcome_evt.wait(timeout):
            raise RuntimeError("no welcome from the launcher")
        return self.welcome or {}


class ControlWriter:
    """MetricsWriter stand-in: records go to the launcher, which writes metrics.jsonl."""

    def __init__(self, ch):
        self.ch = ch

    def write(self, kind: str, **fields):
        self.ch.send("record", kind=kind, fields=fields)

    def event(self, name: str, **fields):
        self.write("event", name=name, **fields)


class WorkerStop:
    """StopControl stand-in: the launcher handles signals; a drafter learns of a stop from WorkerControl."""

    requested = False
    saving = False

    def drain(self) -> None:
        pass


def meter_thread(ch, meter, depth_of) -> None:
    def run():
        last = time.monotonic()
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            tokens, busy = meter.take(now)
            depth, cap = depth_of()
            ch.send("meter", tokens=tokens, busy=busy, dt=now - last, depth=depth, capacity=cap)
            last = now

    threading.Thread(target=named(run), name="dflash-meter", daemon=True).start()


def run_target(args, devices, layout, ti: int, device: str, ctl: WorkerControl, log: Logger) -> int:
    import torch

    from trainer.data.dataset import Plan, load_dir
    from trainer.runtime.gpu_meter import role_meter
    from trainer.runtime.handoff import run_sender
    from trainer.runtime.roles import TargetRole
    from trainer.runtime.startup_steps import load_target_events

    meter = role_meter(device, "target", gpu_uuid(device))
    meter_thread(ctl.ch, meter, lambda: (0, 0))
    ds = load_dir(args.data_dir, args.max_seq_len)
    quiet_transformers()
    cfg = draft_config(args)
    ds.check_vocab(cfg.vocab_size)
    plan = Plan.from_flags(ds, args)
    total = total_steps_of(plan, args.grad_accum, layout.ND, args.max_steps)
    welcome = ctl.welcome or {}
    step, cursor = int(welcome.get("step", 0)), int(welcome.get("cursor", 0))
    end = min(plan.total, cursor + max(0, total - step) * args.grad_accum * layout.ND)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    startup = StartupEvents(
        ControlWriter(ctl.ch),
        os.path.abspath(args.output_dir),
        keep=ti == 0,
        role="target",
        device=device,
        rank=layout.target_rank(ti),
    )
    model = load_target_events(startup, args, device, dtype, cfg.target_layer_ids)
    role = TargetRole(model, device, cfg.target_layer_ids, args.use_soft_labels, meter)
    log(f"target ready: micro-batches {cursor + ti}.. every {layout.NT} (to {end})")
    n = run_sender(layout, ti, role, plan, cursor, end, lambda: ctl.exit or ctl.abort)
    log(f"target done: {n} micro-batches sent")
    return 0


def run_drafter(
    args, devices, layout, di: int, device: str, ctl: WorkerControl, group, ctrl_group, log: Logger
) -> int:
    from trainer.runtime.gpu_meter import role_meter
    from trainer.runtime.handoff import PEER_GRACE_S
    from trainer.runtime.sources import DistributedSource

    resume = (ctl.welcome or {}).get("resume")
    writer = ControlWriter(ctl.ch)
    run_dir = os.path.abspath(args.output_dir)
    meter = role_meter(device, "drafter", gpu_uuid(device))
    source = DistributedSource(args, devices, layout, di, device, ctl, group, ctrl_group, meter, log)
    startup = StartupEvents(
        writer, run_dir, keep=di == 0, role="drafter", device=device, rank=layout.drafter_rank(di)
    )
    trainer = Trainer(
        args,
        source,
        WorkerStop(),
        writer,
        run_dir,
        resume,
        device=device,
        replica=di,
        replicas=layout.ND,
        log=log,
        startup=startup,
        mega_name=f"drafter{di}",
    )

    def on_abort(saver: int) -> None:
        trainer.saver = di == saver

    ctl.on_abort = on_abort
    meter_thread(ctl.ch, meter, lambda: (source.queue.depth() if source.queue else 0, args.hs_queue_depth))
    try:
        trainer.setup()
        code, reason = trainer.train()
    except Exception as e:
        # a collective that failed because a peer died: the launcher's abort follows in a moment
        aborted = ctl.wait_abort(PEER_GRACE_S)
        if trainer.saver and trainer.trained:  # save what it can: the last complete step's state
            try:
                log(
                    f"{'aborted' if aborted else 'error'} while training ({type(e).__name__}): "
                    "saving the last complete step"
                )
                trainer.save()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        if not aborted:
            raise
        code, reason = EXIT_ERROR, "error"
    ctl.ch.send("done", code=code, reason=reason)
    return code


def main(argv: list[str] | None = None) -> int:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack to stderr
    die_with_parent()
    from trainer.runtime import control_channel
    from trainer.runtime.handoff import Layout

    argv = list(sys.argv[1:] if argv is None else argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args = parse_worker_argv(argv)  # the launcher's --settings JSON, or torchrun's flags (exit 2 on bad ones)
    try:  # authenticated both ways with the launch's secret (runtime/control_channel.py)
        secret = control_channel.worker_secret(os.path.abspath(args.output_dir))
        ch = control_channel.connect(os.environ["DFLASH_CONTROL"], secret)
    except control_channel.AuthError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        finish(EXIT_ERROR)
    role, device = "?", "?"
    try:
        args = resolve(args)  # the launcher's settings as they came; torchrun's flags resolved, checked here
        devices = args.devices()
        T, D = len(devices.target), len(devices.drafter)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if local_world != T + D or world % (T + D):
            raise FlagError(
                "--target-gpus",
                f"{T} target + {D} drafter devices per node need {T + D} processes a "
                f"node; this worker runs with {local_world} a node, {world} in all",
            )
        layout = Layout(T, D, world // (T + D))
        role, idx, local_idx = layout.role_of(rank)
        name_this_thread(f"dflash-{role}{idx}")  # the process as top and ps show it
        device = (devices.target if role == "target" else devices.drafter)[local_idx]
        log = Logger(f"[{role}{idx} {device}] ")  # every line of this worker
        ctl = WorkerControl(ch, role)
        ch.send(
            "hello",
            rank=rank,
            role=role,
            index=idx,
            device=device,
            uuid=None,
            pid=os.getpid(),
            host=node_name(),
        )
        ctl.start()
        import torch
        import torch.distributed as dist

        check_devices(devices)
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(device)
            ch.send("uuid", uuid=gpu_uuid(device))
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())
        ctl.wait_welcome()
        from datetime import timedelta

        backend, timeout = "cpu:gloo,cuda:nccl" if cuda else "gloo", timedelta(minutes=30)
        if os.environ.get("DFLASH_EXTERNAL_STORE") == "1":  # the launcher's store (torchrun: env:// as usual)
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(minutes=5),
            )
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        group = dist.new_group(layout.drafter_ranks)
        ctrl_group = dist.new_group(layout.drafter_ranks, backend="gloo")
        if role == "target":
            code = run_target(args, devices, layout, idx, device, ctl, log)
            ch.send("done", code=code, reason="finished")
        else:
            code = run_drafter(args, devices, layout, idx, device, ctl, group, ctrl_group, log)
    except (FlagError, DataError) as e:
        ch.send("fatal", code=EXIT_USAGE, message=str(e))
        finish(EXIT_USAGE)
    except BaseException as e:  # noqa: BLE001 - reported to the launcher, then exit 1
        traceback.print_exc()
        ch.send("fatal", code=EXIT_ERROR, message=f"{role} {device}: {type(e).__name__}: {e}")
        finish(EXIT_ERROR)
    finish(code)
    return code


if __name__ == "__main__":
    main()
