"""``python -m trainer.pipeline``: train a DFlash drafter; the process the console launches, watches and stops.

One process (this issue): target worker thread(s), one per ``--target-gpus`` device, feed a bounded
hidden-state queue; the main thread runs the drafter role on the ``--drafter-gpus`` device. The run
directory (run.json, metrics.jsonl, checkpoints/) follows docs/run-directory.md; log lines go to stdout.

Exit status: 0 finished or stopped by SIGINT/SIGTERM (after a checkpoint), 1 error, 2 bad flags / data /
busy run directory, 3 stopped after repeated NaN losses (after saving the last good state).
Test instrumentation: ``DFLASH_TEST_NAN_STEPS=3,4`` makes those (1-based) steps' loss NaN;
``DFLASH_TEST_PAUSE_AT`` pauses the checkpoint writer (trainer/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
import traceback

import numpy as np

from trainer import __version__, checkpoint, rundir
from trainer.data import DataError, Plan, load_dir
from trainer.flags import FlagError, build_parser, check_devices, flag_for_setting, validate
from trainer.schedule import lr_at, noise_at
from trainer.stopping import StopControl

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NAN = 0, 1, 2, 3
NAN_LIMIT = 5  # consecutive NaN steps that stop the run
KEEP_CHECKPOINTS = 2
SAVE_TIMES = "save_seconds.json"  # in checkpoints/: durations of past saves


def log(msg: str) -> None:
    print(msg, flush=True)


def resolve_resume(resume: str, ckpt_root: str) -> str | None:
    if resume == "none":
        return None
    if resume == "auto":
        return checkpoint.latest(ckpt_root)
    path = os.path.abspath(resume)
    if not checkpoint.is_complete(path):
        raise FlagError("--resume", f"{resume!r} is not a complete checkpoint (no valid manifest.json)")
    return path


def _gpu_uuid(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    try:
        u = torch.cuda.get_device_properties(int(device.split(":")[1])).uuid
        return u if str(u).startswith("GPU-") else f"GPU-{u}"
    except Exception:  # noqa: BLE001 - older torch: no uuid
        return None


class Trainer:
    def __init__(self, args, devices, stop: StopControl, writer: rundir.MetricsWriter, reporter: rundir.Reporter,
                 run_dir: str, resume_path: str | None):
        self.args, self.devices, self.stop, self.writer, self.reporter = args, devices, stop, writer, reporter
        self.run_dir, self.resume_path = run_dir, resume_path
        self.ckpt_root = os.path.join(run_dir, "checkpoints")
        self.save_seconds: list[float] = []
        self.workers = []
        self.queue = None

    # -- setup -----------------------------------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        t0 = time.monotonic()
        ds = load_dir(a.data_dir, a.max_seq_len)  # before the heavy imports: bad data fails fast
        log(f"data: {len(ds)} sequences, {len(ds.tokens)} tokens from {len(ds.files)} file(s) "
            f"({ds.truncated} truncated to --max-seq-len, {ds.dropped} without trained tokens dropped)")
        import torch
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # e.g. the load report of the deliberately truncated target
        hf_logging.disable_progress_bar()

        from trainer.config import DraftConfig
        from trainer.head import FrozenHead
        from trainer.model import DFlashDrafter
        from trainer.rundir import RoleMeter

        check_devices(self.devices)
        try:
            tcfg = AutoConfig.from_pretrained(a.target_model)
            cfg = DraftConfig.from_target_config(
                tcfg, num_draft_layers=a.num_draft_layers, block_size=a.block_size, mask_token_id=a.mask_token_id,
                target_layer_ids=a.target_layer_ids, layer_types=a.layer_types, sliding_window=a.sliding_window)
        except ValueError as e:
            raise FlagError(flag_for_setting(str(e)), str(e)) from None
        ds.check_vocab(cfg.vocab_size)
        self.cfg, self.ds = cfg, ds
        self.plan = Plan(ds, seed=a.seed, epochs=a.epochs, token_budget=a.token_budget, max_batch_size=a.max_batch_size)
        total = self.plan.total // a.grad_accum
        if a.max_steps:
            total = min(total, a.max_steps)
        if total < 1:
            raise FlagError("--grad-accum", f"the data gives {self.plan.total} micro-batches, fewer than "
                                            f"--grad-accum {a.grad_accum}: not one optimizer step")
        self.total_steps = total

        ddev = self.devices.drafter[0]
        cuda = ddev.startswith("cuda")
        if cuda:
            torch.cuda.set_device(ddev)
        torch.manual_seed(a.seed)
        random.seed(a.seed)
        np.random.seed(a.seed % 2**32)
        self.drafter = DFlashDrafter(cfg).to(ddev)
        self.drafter.train()
        self.head = FrozenHead.from_pretrained(a.target_model, dtype=torch.bfloat16 if cuda else torch.float32,
                                               device=ddev)
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        self.generator = torch.Generator(device=ddev)
        self.generator.manual_seed(a.seed + 1)
        self.step, self.cursor = 0, 0
        self.resumed_step = None
        if self.resume_path:
            self._load(self.resume_path)

        from trainer.roles import DrafterRole, HiddenStateQueue, TargetRole
        from trainer.target import load_target

        self.target_meters = [RoleMeter(d, "target", _gpu_uuid(d)) for d in self.devices.target]
        self.drafter_meter = RoleMeter(ddev, "drafter", _gpu_uuid(ddev))
        tdtype = torch.bfloat16 if self.devices.target[0].startswith("cuda") else torch.float32
        self.target_roles = []
        for d, m in zip(self.devices.target, self.target_meters, strict=True):
            model = load_target(a.target_model, d, tdtype, cfg.target_layer_ids, need_final_hidden=a.use_soft_labels)
            self.target_roles.append(TargetRole(model, d, cfg.target_layer_ids, a.use_soft_labels, m))
        self.role = DrafterRole(self.drafter, self.head, self.optimizer, device=ddev, block_size=cfg.block_size,
                                max_anchors=a.max_anchors, gamma=a.gamma, noise_type=a.noise_type,
                                grad_clip=a.grad_clip, generator=self.generator, meter=self.drafter_meter)
        self.queue = HiddenStateQueue(len(self.target_roles), a.hs_queue_depth)
        log(f"drafter: {sum(p.numel() for p in self.drafter.parameters())} parameters, "
            f"{cfg.num_draft_layers} layer(s), block {cfg.block_size}, target layers {cfg.target_layer_ids}, "
            f"mask token {cfg.mask_token_id}; {self.plan.total} micro-batches over {a.epochs} epoch(s), "
            f"{self.total_steps} optimizer steps; setup {time.monotonic() - t0:.1f}s")

    def _load(self, path: str) -> None:
        import torch
        from safetensors.torch import load_file

        from trainer.export import config_from_json

        with open(os.path.join(path, "drafter", "config.json"), encoding="utf-8") as f:
            saved_cfg = config_from_json(json.load(f)).to_dict()
        now = self.cfg.to_dict()
        diff = sorted(k for k in now if now[k] != saved_cfg.get(k))
        if diff:
            raise FlagError("--resume", f"checkpoint {path} has a different drafter config ({', '.join(diff)}); "
                                        "use the flags it was trained with, or --resume none")
        state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
        weights = load_file(os.path.join(path, "drafter", "model.safetensors"), device=str(self.devices.drafter[0]))
        self.drafter.load_state_dict(weights, strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self.generator.set_state(rng["generator"])
        self.step, self.cursor = int(state["step"]), int(state["cursor"])
        self.resumed_step = self.step
        self.save_seconds = list(state.get("save_seconds", []))
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.ckpt_root, SAVE_TIMES)) as f:
            self.save_seconds = [float(x) for x in json.load(f)]
        if state.get("data_fingerprint") != self.ds.fingerprint():
            log(f"warning: --data-dir content differs from the data checkpoint {path} was trained on; "
                "the data cursor is applied to the new data as is")
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

    def _payload(self, tmp: str) -> None:
        import torch

        from trainer.export import save_drafter

        save_drafter(self.drafter, self.cfg, os.path.join(tmp, "drafter"))
        state = {
            "step": self.step,
            "cursor": self.cursor,
            "optimizer": self.optimizer.state_dict(),
            "rng": self._rng_state(),
            "save_seconds": self.save_seconds[-10:],
            "flags": vars(self.args),
            "data_fingerprint": self.ds.fingerprint(),
            "version": __version__,
        }
        torch.save(state, os.path.join(tmp, "state.pt"))

    def save(self) -> None:
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
            if self.resumed_step == self.step and self.resume_path == existing and checkpoint.is_complete(existing):
                path, reused = existing, True  # nothing trained since this checkpoint was loaded: it is this state
                nbytes = sum(checkpoint.read_manifest(existing)["files"].values()) + os.path.getsize(
                    os.path.join(existing, checkpoint.MANIFEST))
            else:
                meta = {"cursor": self.cursor, "epoch": self.plan.epoch_progress(self.cursor), "time": time.time(),
                        "version": __version__, "total_steps": self.total_steps}
                path, nbytes = checkpoint.save(self.ckpt_root, self.step, self._payload, meta, keep=KEEP_CHECKPOINTS)
        finally:
            self.stop.saving = False
        seconds = time.monotonic() - t0
        if not reused:  # a real write: a data point for expected_s
            self.save_seconds.append(seconds)
            with contextlib.suppress(OSError):  # kept for the next run in this dir
                rundir.atomic_write_text(os.path.join(self.ckpt_root, SAVE_TIMES),
                                         json.dumps(self.save_seconds[-10:]))
        self.stop.drain()
        self.writer.event("checkpoint_saved", step=self.step, path=path, seconds=seconds, bytes=nbytes)
        log(f"checkpoint saved: {path} ({nbytes / 1e6:.1f} MB, {seconds:.2f}s)")

    # -- training ------------------------------------------------------------------------------------------
    def start_workers(self) -> None:
        from trainer.roles import TargetWorker

        end = min(self.plan.total, self.cursor + (self.total_steps - self.step) * self.args.grad_accum)
        n = len(self.target_roles)
        self.workers = [TargetWorker(r, self.plan, i, n, self.cursor, end, self.queue)
                        for i, r in enumerate(self.target_roles)]
        self.reporter.queue_stats = lambda: (self.queue.depth(), self.queue.capacity)
        self.reporter.meters.extend([*self.target_meters, self.drafter_meter])
        for w in self.workers:
            w.start()

    def stop_workers(self) -> None:
        if self.queue is not None:
            self.queue.close()
        for w in self.workers:
            w.join(timeout=60)

    def train(self) -> tuple[int, str]:
        import torch

        from trainer.loss import metrics_to_floats
        from trainer.roles import Stopped

        a = self.args
        poison = {int(x) for x in os.environ.get("DFLASH_TEST_NAN_STEPS", "").split(",") if x.strip()}
        nan_streak = 0
        need = (self.total_steps - self.step) * a.grad_accum
        if self.step < self.total_steps and self.cursor + need > self.plan.total:
            raise FlagError("--data-dir", f"the checkpoint's data cursor ({self.cursor}) plus {need} micro-batches "
                                          f"to go exceeds the {self.plan.total} this data gives")
        self.start_workers()
        while self.step < self.total_steps and not self.stop.requested:
            snap = (self.generator.get_state(), torch.get_rng_state())
            g0 = self.cursor
            noise = noise_at(self.step, start=a.noise_start, end=a.noise_end, total_steps=self.total_steps)
            lr = lr_at(self.step, base_lr=a.lr, total_steps=self.total_steps, warmup_ratio=a.warmup_ratio)
            micro, tokens, abandoned = [], 0, False
            for k in range(a.grad_accum):
                try:
                    hb = self.queue.get(self.cursor, lambda: self.stop.requested)
                except Stopped:
                    abandoned = True
                    break
                micro.append(self.role.micro_step(hb, noise, 1.0 / a.grad_accum, poison=(self.step + 1) in poison))
                tokens += hb.tokens
                self.cursor += 1
                del hb
                if self.stop.requested and k < a.grad_accum - 1:
                    abandoned = True
                    break
            if abandoned:  # stop mid-step: drop the partial gradient, rewind to the step's start
                self.role.discard()
                self.generator.set_state(snap[0])
                torch.set_rng_state(snap[1])
                self.cursor = g0
                break
            norm = self.role.clip()
            loss = torch.stack([m["loss"].float() for m in micro]).mean()
            merged = {
                "acc": torch.stack([m["acc"].float() for m in micro]).mean(0),
                "accept_len": torch.stack([m["accept_len"].float() for m in micro]).mean(),
                "n_blocks": torch.stack([m["n_blocks"] for m in micro]).sum(),
            }
            loss_f, norm_f = torch.stack([loss, norm.float().to(loss.device)]).tolist()
            self.step += 1
            if not (np.isfinite(loss_f) and np.isfinite(norm_f)):
                self.role.discard()
                nan_streak += 1
                self.writer.event("nan_skipped", step=self.step)
                log(f"step {self.step}: non-finite loss or gradient ({loss_f}, {norm_f}): step skipped "
                    f"({nan_streak} in a row)")
                if nan_streak >= NAN_LIMIT:
                    log(f"{NAN_LIMIT} non-finite steps in a row: saving the last good weights and stopping")
                    self.stop_workers()
                    self.save()
                    return EXIT_NAN, "nan"
            else:
                nan_streak = 0
                self.role.apply(lr)
                mf = metrics_to_floats(merged)
                epoch = self.plan.epoch_progress(self.cursor)
                self.writer.write("step", step=self.step, total_steps=self.total_steps, epoch=epoch, loss=loss_f,
                                  acc=mf["acc"], accept_len=mf["accept_len"], lr=lr, grad_norm=norm_f,
                                  tokens=tokens, blocks=mf["n_blocks"], noise=noise)
                if self.step % a.log_every == 0 or self.step == self.total_steps:
                    log(f"step {self.step}/{self.total_steps} epoch {epoch:.3f} loss {loss_f:.4f} "
                        f"accept {mf['accept_len']:.2f} acc1 {mf['acc'][0]:.3f} lr {lr:.3g} gnorm {norm_f:.3g} "
                        f"tokens {tokens}")
            if a.save_every and self.step % a.save_every == 0 and self.step < self.total_steps:
                self.save()
        self.stop_workers()
        self.save()
        if self.stop.requested:
            return EXIT_OK, "signal"
        return EXIT_OK, "finished"


def main(argv: list[str] | None = None) -> int:
    stop = StopControl()
    stop.install()
    args = build_parser().parse_args(argv)  # exits 2 naming the flag on unknown/ill-typed flags
    try:
        devices = validate(args)
    except FlagError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    run_dir = os.path.abspath(args.output_dir)
    os.makedirs(run_dir, exist_ok=True)
    ckpt_root = os.path.join(run_dir, "checkpoints")
    try:
        rundir.check_not_running(run_dir)
        resume_path = resolve_resume(args.resume, ckpt_root)
    except rundir.RunDirBusy as e:
        print(f"error: --output-dir: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except FlagError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    rundir.write_run_json(run_dir, rundir.run_info(run_dir, {"target": devices.target, "drafter": devices.drafter},
                                                   __version__))
    for n in checkpoint.remove_partial(ckpt_root):
        log(f"removed an unfinished checkpoint folder: {n}")
    writer = rundir.MetricsWriter(os.path.join(run_dir, "metrics.jsonl"))
    start_step = int(checkpoint.read_manifest(resume_path)["step"]) if resume_path else 0
    writer.event("started", pid=os.getpid(), step=start_step)
    log(f"trainer {__version__} pid {os.getpid()} run dir {run_dir}"
        + (f", resuming from {resume_path}" if resume_path else ", fresh start"))
    stop.writer = writer
    reporter = rundir.Reporter(writer, [], queue_stats=lambda: (0, args.hs_queue_depth))
    reporter.on_tick.append(stop.drain)
    reporter.start()
    trainer = Trainer(args, devices, stop, writer, reporter, run_dir, resume_path)
    try:
        trainer.setup()
        code, reason = trainer.train()
    except (FlagError, DataError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        writer.event("error", message=str(e))
        code, reason = EXIT_USAGE, "error"
    except Exception as e:  # noqa: BLE001 - reported in metrics.jsonl and train.log, then exit 1
        traceback.print_exc()
        writer.event("error", message=f"{type(e).__name__}: {e}")
        code, reason = EXIT_ERROR, "error"
    finally:
        trainer.stop_workers()
        reporter.stop()
    stop.drain()
    writer.event("stopped", reason=reason, exit_code=code)
    log(f"stopped: {reason} (exit {code})")
    writer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
