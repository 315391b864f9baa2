"""The drafter's training loop and its checkpoints, shared by the single-process pipeline and drafter workers.

``Trainer`` sets up the drafter (weights, frozen head, AdamW, resume), then runs optimizer steps over
micro-batches taken from a ``HiddenStateQueue`` (``queue.get(g, should_stop)``; ``runtime.hidden_queue``),
filled by target threads in one process or by a drafter worker's point-to-point receiver
(``runtime.handoff``). With ``replicas`` drafter replicas (DDP, ``dist`` set) an optimizer step consumes
``grad_accum * replicas`` consecutive micro-batches: replica ``r`` takes ``c0 + j * replicas + r`` for
``j < grad_accum``. Each micro-batch's anchors and noise come from a generator seeded by ``(seed, g)``
alone, so D replicas with DDP averaging compute what one process with ``--grad-accum D * A`` does over the
same micro-batches (the same checkpoints, too: a run may resume under the other mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time

import numpy as np

from trainer import __version__
from trainer.data.dataset import Plan, load_dir
from trainer.run import checkpoint, rundir
from trainer.run.flags import FlagError, check_devices, dflash2_flags, flag_for_setting
from trainer.run.schedule import lr_at, noise_at
from trainer.runtime import compile_cache
from trainer.runtime.background import Background
from trainer.runtime.startup_steps import first_batch_events, load_target_events, startup_phase

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NAN, EXIT_SAVE_FAILED = 0, 1, 2, 3, 4
NAN_LIMIT = 5  # consecutive NaN steps that stop the run
EST_WINDOW = 50  # steps in the running mean of accept_len_est


def running_estimate(window: list[tuple[float, ...]]) -> tuple[float | None, float | None]:
    """``(accept_len_est, accept_len_est_uniform)`` over the window's ``(chain sum, blocks, walk tokens, walk
    steps)`` entries: the walk's tokens / steps (drafting.acceptance) and 1 + chains / blocks. A checkpoint
    written before the walk was counted has ``(chain sum, blocks)`` pairs: they count for the uniform mean only."""
    blocks = sum(e[1] for e in window)
    steps = sum(e[3] for e in window if len(e) > 3)
    walk = sum(e[2] for e in window if len(e) > 3) / steps if steps else None
    return walk, (1.0 + sum(e[0] for e in window) / blocks if blocks else None)


SELECTOR_FIELDS = ("selector_loss", "selector_recall", "selector_acc")  # DFlash 2's step-record fields
SAVE_TIMES = "save_seconds.json"  # in checkpoints/: durations of past saves

LOG_PREFIX = ""  # a worker's "[drafter0 cuda:1] "


def log(msg: str) -> None:
    print(LOG_PREFIX + msg, flush=True)


def micro_seed(seed: int, g: int) -> int:
    """The anchor/noise generator's seed for micro-batch ``g`` (a function of the seed and ``g`` only)."""
    return (seed * 1_000_003 + g * 7_919 + 1) % (2**63 - 1)


def gpu_uuid(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    try:
        u = str(torch.cuda.get_device_properties(int(device.split(":")[1])).uuid)
        return u if u.startswith("GPU-") else f"GPU-{u}"
    except Exception:  # noqa: BLE001 - older torch: no uuid
        return None


def total_steps_of(plan: Plan, grad_accum: int, replicas: int, max_steps: int | None) -> int:
    total = plan.total // (grad_accum * replicas)
    if max_steps:
        total = min(total, max_steps)
    if total < 1:
        raise FlagError(
            "--grad-accum",
            f"the data gives {plan.total} micro-batches, fewer than --grad-accum "
            f"{grad_accum} x {replicas} drafter replica(s): not one optimizer step",
        )
    return total


def draft_config(args):
    from transformers import AutoConfig

    from trainer.drafting.config import DraftConfig

    try:
        tcfg = AutoConfig.from_pretrained(args.target_model)
        return DraftConfig.from_target_config(
            tcfg,
            num_draft_layers=args.num_draft_layers,
            block_size=args.block_size,
            mask_token_id=args.mask_token_id,
            target_layer_ids=args.target_layer_ids,
            layer_types=args.layer_types,
            sliding_window=args.sliding_window,
            arch=getattr(args, "arch", None) or "dflash",
            dflash2=dflash2_flags(args),
        )
    except ValueError as e:
        raise FlagError(flag_for_setting(str(e)), str(e)) from None


def quiet_transformers() -> None:
    """transformers as the trainer runs it: no scikit-learn (``without_sklearn``), errors only, no progress bars.
    Called before anything else imports transformers' models."""
    without_sklearn()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # e.g. the load report of the deliberately truncated target
    hf_logging.disable_progress_bar()


def without_sklearn() -> None:
    """Tell transformers that scikit-learn is not installed, unless something imported it already.

    transformers (up to at least 5.17) imports scikit-learn with its generation utilities, which every model
    class pulls in, for one thing: the confidence threshold of *assisted* generation (``candidate_generator``),
    which this trainer never runs. On an H200 host that import was 1.5-2 s of every start (issue 22's profile;
    newer transformers import it lazily). The check is ``is_sklearn_available()``, read when
    ``candidate_generator`` is imported: patched here on the two modules that define and re-export it."""
    if "sklearn" in sys.modules or "transformers.generation.candidate_generator" in sys.modules:
        return
    import transformers.utils as hf_utils
    from transformers.utils import import_utils

    def unavailable() -> bool:
        return False

    for mod in (hf_utils, import_utils):
        if hasattr(mod, "is_sklearn_available"):
            mod.is_sklearn_available = unavailable


class Trainer:
    """The drafter side of a run. ``dist`` (a ``runtime.worker.DrafterDist``) is set in a drafter worker."""

    def __init__(
        self,
        args,
        devices,
        stop,
        writer,
        reporter,
        run_dir: str,
        resume_path: str | None,
        *,
        device: str | None = None,
        replica: int = 0,
        replicas: int = 1,
        dist=None,
    ):
        self.args, self.devices, self.stop, self.writer, self.reporter = args, devices, stop, writer, reporter
        self.run_dir, self.resume_path = run_dir, resume_path
        self.device = device or devices.drafter[0]
        self.replica, self.replicas, self.dist = replica, replicas, dist
        self.saver = replica == 0  # writes checkpoints and step records
        self.ckpt_root = os.path.join(run_dir, "checkpoints")
        self.save_seconds: list[float] = []
        self.last_save_t = time.monotonic()  # the last save attempt (--save-every-minutes counts from it)
        self.workers = []
        self.queue = None
        self.trained = False  # an optimizer step was applied in this process
        # (chain sum, blocks, walk tokens, walk steps) of the last EST_WINDOW steps (drafting.acceptance)
        self.est_window: list[tuple[float, ...]] = []
        self.startup = None  # a run.startup.StartupEvents: start-up events until the first step
        self.mega_name = "single"  # this process's compile mega-cache (runtime/compile_cache.py)
        self.mega_thread = None  # its loading thread (setup_model); joined before the first compile
        self.optimizer_load = None  # a resume's optimizer state, loading in the background (_load)
        # what that load waits for first: the target's load in this process (both copy to the GPU from host
        # memory; the target is the one the first step waits for, the moments only its optimizer step)
        self.optimizer_after = None
        self.warmed = False  # the drafter's first step traced on a stand-in batch (runtime/warmup.py)

    # -- setup -----------------------------------------------------------------------------------------
    def setup_model(self, defer_head: bool = False, beside=None) -> None:
        """Data, plan, drafter, head, optimizer, resume (everything but the hidden-state source).
        ``defer_head``: leave ``self.head`` None (setup builds it from the target loaded in this process).
        ``beside``: called once the drafter is built and initialised (setup starts the target's load there, in
        a thread, beside the head, the optimizer and the resume)."""
        a = self.args
        self.t0 = time.monotonic()
        ds = load_dir(a.data_dir, a.max_seq_len)  # before the heavy imports: bad data fails fast
        log(
            f"data: {len(ds)} sequences, {len(ds.tokens)} tokens from {len(ds.files)} file(s) "
            f"({ds.truncated} truncated to --max-seq-len, {ds.dropped} without trained tokens dropped)"
        )
        import torch

        quiet_transformers()
        from trainer.drafting.head import FrozenHead
        from trainer.model import DFlashDrafter

        cfg = draft_config(a)
        ds.check_vocab(cfg.vocab_size)
        self.cfg, self.ds = cfg, ds
        self.plan = Plan.from_flags(ds, a)
        self.total_steps = total_steps_of(self.plan, a.grad_accum, self.replicas, a.max_steps)

        ddev = self.device
        cuda = ddev.startswith("cuda")
        if cuda:
            torch.cuda.set_device(ddev)
        torch.manual_seed(a.seed)
        random.seed(a.seed)
        np.random.seed(a.seed % 2**32)
        startup_phase(self.startup, "building_drafter", device=ddev)
        # in a thread beside the drafter's build and the target's load; joined before anything compiles
        self.mega_thread = compile_cache.load_mega_async(self.mega_name, log)
        with torch.device(ddev):  # initialised on its device: ~14 s on CPU for a 1B-parameter drafter
            self.drafter = DFlashDrafter(cfg)
        self.drafter.train()
        # only now: the target's load skips initialisation through transformers' no_init_weights, which
        # swaps torch's init functions process-wide; a drafter built beside it came out uninitialised (NaN)
        if beside is not None:
            beside()
        self.head_dtype = torch.bfloat16 if cuda else torch.float32
        # built after the target when one shares this process, device and dtype (setup: no second read)
        self.head = (
            None
            if defer_head
            else FrozenHead.from_pretrained(a.target_model, dtype=self.head_dtype, device=ddev)
        )
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        self.generator = torch.Generator(device=ddev)
        self.generator.manual_seed(a.seed + 1)
        self.step, self.cursor = 0, 0
        self.resumed_step = None
        if self.resume_path:
            self._load(self.resume_path)
            if a.init_drafter:
                log(f"--init-drafter {a.init_drafter} not used: resuming this run's own checkpoint")
        elif a.init_drafter:
            self._init_from(a.init_drafter)

    def make_role(self, meter, ddp=None, lock=None):
        self.drafter_meter = meter
        self.role = self.new_role(meter, ddp=ddp, lock=lock)

    def new_role(self, meter, ddp=None, lock=None, head=None):
        """A DrafterRole over this trainer's drafter, optimizer and generator (``head``: instead of its own)."""
        from trainer.runtime.roles import DrafterRole

        a, cfg = self.args, self.cfg
        return DrafterRole(
            self.drafter,
            head if head is not None else self.head,
            self.optimizer,
            device=self.device,
            block_size=cfg.block_size,
            max_anchors=a.max_anchors,
            gamma=a.gamma,
            noise_type=a.noise_type,
            grad_clip=a.grad_clip,
            generator=self.generator,
            meter=meter,
            ddp=ddp,
            lock=lock,
            anchor_run=a.anchor_run,
            est_anchors=a.est_anchors,
            selector_unary_grad=a.selector_unary_grad,
        )

    def setup(self) -> None:
        """Single process: the model side plus target thread(s) and the in-process queue."""
        import torch

        from trainer.runtime.gpu_meter import role_meter
        from trainer.runtime.hidden_queue import HiddenStateQueue, check_queue_memory, hidden_batch_bytes
        from trainer.runtime.roles import TargetRole, launch_lock
        from trainer.runtime.shared_head import head_from_target

        check_devices(self.devices)
        tdtype = torch.bfloat16 if self.devices.target[0].startswith("cuda") else torch.float32
        # a target on the drafter's device in the head's dtype (cuda -> bf16, cpu -> fp32 on both sides):
        # the frozen head shares its embed_tokens / norm / lm_head instead of reading them again
        share = next((d for d in self.devices.target if d == self.device), None)
        loads = []

        def load_targets() -> None:  # in a thread beside the drafter's build and resume (setup_model)
            ids = self.cfg.target_layer_ids
            loads.append(
                Background(
                    lambda: [
                        load_target_events(self.startup, self.args, d, tdtype, ids)
                        for d in self.devices.target
                    ],
                    "load-target",
                )
            )
            self.optimizer_after = loads[-1]

        self.setup_model(defer_head=share is not None, beside=load_targets)
        a, cfg = self.args, self.cfg
        self.target_meters = [role_meter(d, "target", gpu_uuid(d)) for d in self.devices.target]
        lock = launch_lock(self.devices)  # target threads and the drafter in this one process
        self.warm_up(lock, tdtype)  # the drafter's first step compiles now, while the target loads
        self.target_roles = []
        models = loads[0].result()
        for d, m, model in zip(self.devices.target, self.target_meters, models, strict=True):
            if d == share and self.head is None:
                self.head = head_from_target(a.target_model, model, d, self.head_dtype)
            self.target_roles.append(
                TargetRole(model, d, cfg.target_layer_ids, a.use_soft_labels, m, lock=lock)
            )
        self.make_role(role_meter(self.device, "drafter", gpu_uuid(self.device)), lock=lock)
        self.queue = HiddenStateQueue(a.hs_queue_depth, start=self.cursor)
        per = hidden_batch_bytes(a, cfg, 2 if tdtype == torch.bfloat16 else 4)
        for d in self.devices.target:  # the queued batches live on the target's device until taken
            log(check_queue_memory(d, self.queue.capacity, len(self.target_roles), per, a))
        self.log_setup()

    def compile_caches_loaded(self) -> None:
        """Wait for the compile mega-cache's load (setup_model started it): before anything compiles."""
        if self.mega_thread is not None:
            self.mega_thread.join()
            self.mega_thread = None

    def warm_up(self, lock, target_dtype) -> None:
        """Where the drafter's first step compiles (CUDA), compile it now on a stand-in batch (runtime/warmup.py):
        called before the first hidden states can arrive."""
        from trainer.runtime import warmup

        if not warmup.wanted(self.device):
            return
        self.compile_caches_loaded()
        startup_phase(self.startup, "compiling", part="drafter step on a stand-in batch", device=self.device)
        try:
            took = warmup.trace_first_step(self, lock, target_dtype)
        except Exception as e:  # an optimisation: the first real batch compiles as it would have
            if warmup.testing():
                raise
            self.optimizer.zero_grad(set_to_none=True)
            log(
                f"drafter step not traced on a stand-in batch ({type(e).__name__}: {e}); its first batch compiles it"
            )
            return
        self.warmed = took is not None
        if took is not None:
            log(
                f"drafter step traced on a stand-in of micro-batch {self.cursor + self.replica} in {took:.1f}s"
            )

    def log_setup(self) -> None:
        a, cfg = self.args, self.cfg
        log(
            f"drafter: {sum(p.numel() for p in self.drafter.parameters())} parameters, "
            f"{cfg.num_draft_layers} layer(s), block {cfg.block_size}, target layers {cfg.target_layer_ids}, "
            f"mask token {cfg.mask_token_id}; {self.plan.total} micro-batches over {a.epochs} epoch(s), "
            f"{self.total_steps} optimizer steps ({a.grad_accum} x {self.replicas} micro-batches each); "
            f"setup {time.monotonic() - self.t0:.1f}s"
        )

    def _check_config(self, flag: str, path: str, saved: dict, advice: str) -> None:
        now = self.cfg.to_dict()
        diff = sorted(k for k in now if now[k] != saved.get(k))
        if diff:
            raise FlagError(flag, f"{path} has a different drafter config ({', '.join(diff)}); {advice}")

    def _init_from(self, path: str) -> None:
        """--init-drafter: the weights of a drafter directory, cast to the training dtype; nothing else."""
        from safetensors.torch import load_file

        from trainer.model import config_from_json

        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            saved = config_from_json(json.load(f)).to_dict()
        self._check_config("--init-drafter", path, saved, "pass the flags it was trained with")
        weights = load_file(os.path.join(path, "model.safetensors"), device=str(self.device))
        self.drafter.load_state_dict(weights, strict=True)  # copied into the training dtype's tensors
        log(
            f"drafter weights from {path} ({len(weights)} tensors); fresh optimizer, schedule and data cursor"
        )

    def _load(self, path: str) -> None:
        import torch
        from safetensors.torch import load_file

        from trainer.model import config_from_json

        with open(os.path.join(path, "drafter", "config.json"), encoding="utf-8") as f:
            saved_cfg = config_from_json(json.load(f)).to_dict()
        self._check_config(
            "--resume", f"checkpoint {path}", saved_cfg, "use the flags it was trained with, or --resume none"
        )
        # memory-mapped: the optimizer's moments (2 x the drafter in fp32) go from the file to their device
        # once, in load_state_dict, instead of being read into host memory first
        state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False, mmap=True)
        weights = load_file(os.path.join(path, "drafter", "model.safetensors"), device=str(self.device))
        self.drafter.load_state_dict(weights, strict=True)
        # the moments reach the device beside the first step's compile; joined before they are used
        opt_state = state["optimizer"]
        after = self.optimizer_after

        def load_optimizer() -> None:
            if after is not None:
                after.wait()
            self.optimizer.load_state_dict(opt_state)

        self.optimizer_load = Background(load_optimizer, "load-optimizer")
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            with contextlib.suppress(RuntimeError, IndexError):  # saved on a machine with other GPUs
                torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self.generator.set_state(rng["generator"])
        self.step, self.cursor = int(state["step"]), int(state["cursor"])
        self.resumed_step = self.step
        self.save_seconds = list(state.get("save_seconds", []))
        self.est_window = [tuple(x) for x in state.get("accept_est_window", [])]
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.ckpt_root, SAVE_TIMES)) as f:
            self.save_seconds = [float(x) for x in json.load(f)]
        if state.get("data_fingerprint") != self.ds.fingerprint():
            log(
                f"warning: --data-dir content differs from the data checkpoint {path} was trained on; "
                "the data cursor is applied to the new data as is"
            )
        log(f"resumed from {path}: step {self.step}, micro-batch {self.cursor}")

    # -- checkpoints -------------------------------------------------------------------------------------
    def _rng_state(self) -> dict:
        import torch

        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "generator": self.generator.get_state(),
        }

    def optimizer_ready(self) -> None:
        """Wait for a resume's optimizer state (loaded in the background); raises what its load raised."""
        if self.optimizer_load is not None:
            job, self.optimizer_load = self.optimizer_load, None
            job.result()

    def _payload(self, tmp: str) -> None:
        import torch

        self.optimizer_ready()

        from trainer.model import save_drafter

        save_drafter(self.drafter, self.cfg, os.path.join(tmp, "drafter"))  # training dtype: exact resume
        export_dtype = torch.float32 if getattr(self.args, "export_fp32", False) else torch.bfloat16
        save_drafter(self.drafter, self.cfg, os.path.join(tmp, "export"), dtype=export_dtype)  # for serving
        state = {
            "step": self.step,
            "cursor": self.cursor,
            "optimizer": self.optimizer.state_dict(),
            "rng": self._rng_state(),
            "save_seconds": self.save_seconds[-10:],
            "accept_est_window": list(self.est_window),
            "flags": vars(self.args),
            "data_fingerprint": self.ds.fingerprint(),
            "version": __version__,
        }
        torch.save(state, os.path.join(tmp, "state.pt"))

    def save(self) -> bool:
        """Write a checkpoint of the current step; False when the write failed (a full disk...).

        A failed save leaves no partial folder and ``latest`` naming the last complete checkpoint; an
        ``error`` event says what failed and how much space is free; training may go on and the next
        save tries again.
        """
        self.stop.drain()  # a pending stop_requested goes out before checkpoint_saving
        recent = self.save_seconds[-3:]
        expected = sum(recent) / len(recent) if recent else None
        self.writer.event("checkpoint_saving", step=self.step, expected_s=expected)
        log(f"saving checkpoint at step {self.step}" + (f" (about {expected:.1f}s)" if expected else ""))
        self.stop.saving = True
        t0 = time.monotonic()
        try:
            existing = os.path.join(self.ckpt_root, checkpoint.step_dir_name(self.step))
            reused = False
            if (
                self.resumed_step == self.step
                and self.resume_path == existing
                and checkpoint.is_complete(existing)
            ):
                path, reused = (
                    existing,
                    True,
                )  # nothing trained since this checkpoint was loaded: it is this state
                nbytes = sum(checkpoint.read_manifest(existing)["files"].values()) + os.path.getsize(
                    os.path.join(existing, checkpoint.MANIFEST)
                )
            else:
                meta = {
                    "cursor": self.cursor,
                    "epoch": self.plan.epoch_progress(self.cursor),
                    "time": time.time(),
                    "version": __version__,
                    "total_steps": self.total_steps,
                }
                path, nbytes = checkpoint.save(
                    self.ckpt_root,
                    self.step,
                    self._payload,
                    meta,
                    keep=getattr(self.args, "keep_checkpoints", 2),
                )
        except OSError as e:
            self.save_failed(e)
            return False
        finally:
            self.stop.saving = False
            self.last_save_t = time.monotonic()
        seconds = time.monotonic() - t0
        if not reused:  # a real write: a data point for expected_s
            self.save_seconds.append(seconds)
            with contextlib.suppress(OSError):  # kept for the next run in this dir
                rundir.atomic_write_text(
                    os.path.join(self.ckpt_root, SAVE_TIMES), json.dumps(self.save_seconds[-10:])
                )
        self.stop.drain()
        self.writer.event("checkpoint_saved", step=self.step, path=path, seconds=seconds, bytes=nbytes)
        log(f"checkpoint saved: {path} ({nbytes / 1e6:.1f} MB, {seconds:.2f}s)")
        return True

    def save_failed(self, e: OSError) -> None:
        try:
            free = f"{shutil.disk_usage(self.ckpt_root).free / 1e6:.1f} MB free"
        except OSError:
            free = "free space unknown"
        msg = (
            f"checkpoint at step {self.step} failed: {e} ({free} on {self.ckpt_root}); the partial "
            f"checkpoint was removed and checkpoints/latest still names the last complete one"
        )
        self.stop.drain()
        with contextlib.suppress(OSError):  # the disk may refuse this line too
            self.writer.event("error", message=msg, step=self.step)
        log("error: " + msg)

    def stop_asked(self) -> bool:
        """A stop was asked for (a signal here, or the launcher's stop to this worker)."""
        return self.stop.requested or (self.dist is not None and self.dist.stopped)

    def save_due(self) -> bool:
        """A periodic save now? (``--save-every`` steps, or ``--save-every-minutes`` since the last save)"""
        a = self.args
        if a.save_every and self.step % a.save_every == 0:
            return True
        minutes = getattr(a, "save_every_minutes", 0)
        return bool(minutes) and time.monotonic() - self.last_save_t >= minutes * 60

    # -- the hidden-state source (single process: target threads) -------------------------------------
    def data_end(self) -> int:
        a = self.args
        return min(
            self.plan.total, self.cursor + (self.total_steps - self.step) * a.grad_accum * self.replicas
        )

    def start_workers(self) -> None:
        from trainer.runtime.roles import TargetWorker

        end = self.data_end()
        n = len(self.target_roles)
        self.workers = [
            TargetWorker(r, self.plan, i, n, self.cursor, end, self.queue)
            for i, r in enumerate(self.target_roles)
        ]
        self.reporter.queue_stats = lambda: (self.queue.depth(), self.queue.capacity)
        self.reporter.meters.extend([*self.target_meters, self.drafter_meter])
        for w in self.workers:
            w.start()

    def stop_workers(self) -> None:
        if self.queue is not None:
            self.queue.close()
        for w in self.workers:
            w.join(timeout=60)

    # -- training ------------------------------------------------------------------------------------------
    def _stop_now(self) -> bool:
        """At a step boundary: stop here? (replicas agree on it)"""
        if self.dist is None:
            return self.stop.requested
        return self.dist.agree_stop()

    def _abort_check(self) -> bool:
        return self.stop.requested if self.dist is None else self.dist.aborted

    def train(self) -> tuple[int, str]:
        import torch

        from trainer.runtime.hidden_queue import Stopped

        a = self.args
        A, D, r = a.grad_accum, self.replicas, self.replica
        poison = {int(x) for x in os.environ.get("DFLASH_TEST_NAN_STEPS", "").split(",") if x.strip()}
        nan_streak = 0
        need = (self.total_steps - self.step) * A * D
        if self.step < self.total_steps and self.cursor + need > self.plan.total:
            raise FlagError(
                "--data-dir",
                f"the checkpoint's data cursor ({self.cursor}) plus {need} micro-batches "
                f"to go exceeds the {self.plan.total} this data gives",
            )
        self.compile_caches_loaded()
        if self.dist is None:
            self.start_workers()
        else:
            self.queue = self.dist.start(self.plan, self.cursor, self.data_end())
        startup_phase(self.startup, "queue_filling", depth=self.queue.depth(), capacity=self.queue.capacity)
        first = self.startup is not None
        while self.step < self.total_steps and not self._stop_now():
            snap = (self.generator.get_state(), torch.get_rng_state())
            g0 = self.cursor
            noise = noise_at(self.step, start=a.noise_start, end=a.noise_end, total_steps=self.total_steps)
            lr = lr_at(self.step, base_lr=a.lr, total_steps=self.total_steps, warmup_ratio=a.warmup_ratio)
            micro, tokens, abandoned = [], 0, False
            try:
                for k in range(A):
                    g = g0 + k * D + r
                    hb = self.queue.get(g, self._abort_check)
                    if first and k == 0 and not self.warmed:  # else it compiled on a stand-in batch
                        first_batch_events(self.startup, self.device)
                    micro.append(
                        self.role.micro_step(
                            hb,
                            noise,
                            1.0 / A,
                            poison=(self.step + 1) in poison,
                            seed=micro_seed(a.seed, g),
                            sync=k == A - 1,
                        )
                    )
                    tokens += hb.tokens
                    del hb
                    if self.dist is None and self.stop.requested and k < A - 1:
                        abandoned = True
                        break
            except Stopped:
                abandoned = True
            if abandoned:  # stop mid-step: drop the partial gradient, rewind to the step's start
                self.role.discard()
                self.generator.set_state(snap[0])
                torch.set_rng_state(snap[1])
                self.cursor = g0
                break
            self.cursor = g0 + A * D
            norm = self.role.clip()
            # one packed vector (summed over replicas): DFlash 2's selector sums (loss, recall, acc; none for
            # DFlash 1), loss sum, chain sum, acc sums, accept_len sum, blocks, tokens
            sel_names = [k for k in SELECTOR_FIELDS if k in micro[0]]
            packed = torch.cat(
                [
                    *(torch.stack([m[k].double() for m in micro]).sum().view(1) for k in sel_names),
                    torch.stack([m["loss"].double() for m in micro]).sum().view(1),
                    torch.stack([m["chain_sum"].double() for m in micro]).sum().view(1),
                    torch.stack([m["walk_tokens"].double() for m in micro]).sum().view(1),
                    torch.stack([m["walk_steps"].double() for m in micro]).sum().view(1),
                    torch.stack([m["acc"].double() for m in micro]).sum(0),
                    torch.stack([m["accept_len"].double() for m in micro]).sum().view(1),
                    torch.stack([m["n_blocks"].double() for m in micro]).sum().view(1),
                    torch.tensor([float(tokens)], dtype=torch.float64, device=micro[0]["loss"].device),
                ]
            )
            if self.dist is not None:
                packed = self.dist.sum_metrics(packed)
            vals = torch.cat([packed, norm.double().view(1).to(packed.device)]).tolist()
            n = A * D
            selector = {k: v / n for k, v in zip(sel_names, vals[: len(sel_names)], strict=True)}
            vals = vals[len(sel_names) :]
            loss_f, chain, walk_tok, walk_steps = vals[0] / n, vals[1], vals[2], vals[3]
            acc = [x / n for x in vals[4:-4]]
            accept, blocks, tokens, norm_f = vals[-4] / n, int(vals[-3]), int(vals[-2]), vals[-1]
            self.step += 1
            if not (np.isfinite(loss_f) and np.isfinite(norm_f)):
                self.role.discard()
                nan_streak += 1
                if self.saver:
                    self.writer.event("nan_skipped", step=self.step)
                log(
                    f"step {self.step}: non-finite loss or gradient ({loss_f}, {norm_f}): step skipped "
                    f"({nan_streak} in a row)"
                )
                if nan_streak >= NAN_LIMIT:
                    log(f"{NAN_LIMIT} non-finite steps in a row: saving the last good weights and stopping")
                    self.stop_workers()
                    if self.saver:
                        self.save()
                    return EXIT_NAN, "nan"
            else:
                nan_streak = 0
                self.optimizer_ready()
                self.role.apply(lr)
                self.est_window = [*self.est_window, (chain, float(blocks), walk_tok, walk_steps)][
                    -EST_WINDOW:
                ]
                est, est_uniform = running_estimate(self.est_window)
                self.trained = True
                epoch = self.plan.epoch_progress(self.cursor)
                if self.saver:
                    self.writer.write(
                        "step",
                        step=self.step,
                        total_steps=self.total_steps,
                        epoch=epoch,
                        loss=loss_f,
                        acc=acc,
                        accept_len=accept,
                        accept_len_est=est,
                        accept_len_est_step=walk_tok / walk_steps if walk_steps else None,
                        # judged by the target's own argmax where soft labels carry its logits, else the data
                        accept_len_est_vs="target" if a.use_soft_labels else "data",
                        # the blocks the walk read: the measuring runs (--est-anchors) or the training ones
                        accept_len_est_anchors="runs" if a.est_anchors else "training",
                        accept_len_est_uniform=est_uniform,
                        lr=lr,
                        grad_norm=norm_f,
                        tokens=tokens,
                        blocks=blocks,
                        noise=noise,
                        **selector,
                    )
                    if self.step % a.log_every == 0 or self.step == self.total_steps:
                        log(
                            f"step {self.step}/{self.total_steps} epoch {epoch:.3f} loss {loss_f:.4f} "
                            f"accept_est {est or 0:.2f} acc1 {acc[0]:.3f} lr {lr:.3g} gnorm {norm_f:.3g} tokens {tokens}"
                        )
            if first:
                first = False
                if self.saver:
                    self.startup.first_step(self.step)
                    compile_cache.save_mega(self.mega_name)
            periodic = self.saver and self.step < self.total_steps and not self.stop_asked()
            if periodic and self.save_due() and not self.save():  # a stop saves once, below
                log("training goes on; the next save tries again")
        self.stop_workers()
        saved = self.save() if self.saver else True
        if self.dist is not None and self.dist.aborted:
            return EXIT_ERROR, "error"
        if not saved:
            return EXIT_SAVE_FAILED, "checkpoint_failed"
        if self.stop_asked():
            return EXIT_OK, "signal"
        return EXIT_OK, "finished"
