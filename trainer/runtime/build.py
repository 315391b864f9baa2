"""The drafter's setup, whichever source feeds it: data, plan, drafter, head, AdamW, the resume (or
``--init-drafter``), the compile mega-cache's load, the first step traced on a stand-in batch
(runtime/warmup.py), the ``DrafterRole`` that runs its micro-steps. ``DrafterBuild.state`` returns the
``DrafterState`` (runtime/drafter_state.py) the step loop then advances."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time

import numpy as np

from trainer.data.dataset import Plan, load_dir
from trainer.run import state_file
from trainer.run.flags import FlagError, loss_objective, resolve_labels
from trainer.run.schedule import noise_at
from trainer.runtime import compile_cache
from trainer.runtime.background import Background
from trainer.runtime.checkpointing import past_save_seconds
from trainer.runtime.common import draft_config, micro_seed, quiet_transformers, total_steps_of
from trainer.runtime.drafter_state import DrafterState
from trainer.runtime.startup_steps import startup_phase


class DrafterBuild:
    """Builds replica ``replica`` of ``replicas`` on ``device``. ``startup``: a run.startup.StartupEvents (start-up
    events until the first step) or None; ``mega_name``: this process's compile mega-cache
    (runtime/compile_cache.py)."""

    def __init__(
        self,
        args,
        device: str,
        resume_path: str | None,
        ckpt_root: str,
        log,
        *,
        replica: int = 0,
        replicas: int = 1,
        startup=None,
        mega_name: str = "single",
    ):
        self.args, self.device, self.log = args, device, log
        self.resume_path, self.ckpt_root = resume_path, ckpt_root
        self.replica, self.replicas, self.startup, self.mega_name = replica, replicas, startup, mega_name
        self.mega_thread = None  # the mega-cache's loading thread (state); joined before the first compile
        self.warmed = False  # the drafter's first step traced on a stand-in batch (warm_up)
        self.t0 = time.monotonic()

    def state(self, defer_head: bool = False, beside=None) -> DrafterState:
        """Data, plan, drafter, head, optimizer, resume (everything but the hidden-state source).
        ``defer_head``: leave the head None (a target loaded in this process lends it its tensors).
        ``beside(cfg)``: called once the drafter is built and initialised (a source starts the target's load
        there, in a thread, beside the head, the optimizer and the resume); what it returns (a Background or
        None) is what a resume's optimizer load waits for first."""
        a = self.args
        self.t0 = time.monotonic()
        ds = load_dir(a.data_dir, a.max_seq_len)  # before the heavy imports: bad data fails fast
        self.log(
            f"data: {len(ds)} sequences, {len(ds.tokens)} tokens from {len(ds.files)} file(s) "
            f"({ds.truncated} truncated to --max-seq-len, {ds.dropped} without trained tokens dropped)"
        )
        import torch

        quiet_transformers()
        from trainer.drafting.head import FrozenHead
        from trainer.model import DFlashDrafter

        cfg = draft_config(a)
        ds.check_vocab(cfg.vocab_size)
        plan = Plan.from_flags(ds, a)
        if len(plan.holdout):
            self.log(
                f"data: {len(plan.holdout)} sequences held out of training for accept_len_est (--est-holdout)"
            )
        total_steps = total_steps_of(plan, a.grad_accum, self.replicas, a.max_steps)

        ddev = self.device
        cuda = ddev.startswith("cuda")
        if cuda:
            torch.cuda.set_device(ddev)
        torch.manual_seed(a.seed)
        random.seed(a.seed)
        np.random.seed(a.seed % 2**32)
        startup_phase(self.startup, "building_drafter", device=ddev)
        # in a thread beside the drafter's build and the target's load; joined before anything compiles
        self.mega_thread = compile_cache.load_mega_async(self.mega_name, self.log)
        with torch.device(ddev):  # initialised on its device: ~14 s on CPU for a 1B-parameter drafter
            drafter = DFlashDrafter(cfg)
        drafter.train()
        # only now: the target's load skips initialisation through transformers' no_init_weights, which
        # swaps torch's init functions process-wide; a drafter built beside it came out uninitialised (NaN)
        optimizer_after = beside(cfg) if beside is not None else None
        head_dtype = torch.bfloat16 if cuda else torch.float32
        # built after the target when one shares this process, device and dtype (sources: no second read)
        head = (
            None if defer_head else FrozenHead.from_pretrained(a.target_model, dtype=head_dtype, device=ddev)
        )
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        generator = torch.Generator(device=ddev)
        generator.manual_seed(a.seed + 1)
        st = DrafterState(cfg, ds, plan, total_steps, drafter, head, head_dtype, optimizer, generator)
        if self.resume_path:
            self._resume(st, self.resume_path, optimizer_after)
            if a.init_drafter:
                self.log(f"--init-drafter {a.init_drafter} not used: resuming this run's own checkpoint")
        elif a.init_drafter:
            self._init_from(st, a.init_drafter)
        return st

    def role(self, st: DrafterState, meter, ddp=None, lock=None, head=None):
        """A DrafterRole over the state's drafter, optimizer and generator (``head``: instead of its own)."""
        from trainer.runtime.roles import DrafterRole

        a = self.args
        return DrafterRole(
            st.drafter,
            head if head is not None else st.head,
            st.optimizer,
            device=self.device,
            block_size=st.cfg.block_size,
            max_anchors=a.max_anchors,
            gamma=a.gamma,
            noise_type=a.noise_type,
            grad_clip=a.grad_clip,
            generator=st.generator,
            meter=meter,
            ddp=ddp,
            lock=lock,
            anchor_run=a.anchor_run,
            est_anchors=a.est_anchors,
            est_holdout=a.est_holdout > 0,
            selector_unary_grad=a.selector_unary_grad,
            objective=loss_objective(a),
        )

    def caches_loaded(self) -> None:
        """Wait for the compile mega-cache's load (``state`` started it): before anything compiles."""
        if self.mega_thread is not None:
            self.mega_thread.join()
            self.mega_thread = None

    def warm_up(self, st: DrafterState, lock, target_dtype) -> None:
        """Where the drafter's first step compiles (CUDA), compile it now on a stand-in batch (runtime/warmup.py):
        called before the first hidden states can arrive."""
        from trainer.runtime import warmup  # imports torch: not before trainer.pipeline's bytecode cache

        if not warmup.wanted(self.device):
            return
        self.caches_loaded()
        startup_phase(self.startup, "compiling", part="drafter step on a stand-in batch", device=self.device)
        from trainer.runtime.gpu_meter import role_meter

        a, g = self.args, st.cursor + self.replica  # this replica's first micro-batch (loop.Trainer.train)
        try:
            took = warmup.trace_first_step(
                st,
                lambda head: self.role(st, role_meter(self.device, "drafter"), head=head, lock=lock),
                self.device,
                target_dtype,
                micro_batch=g,
                noise=noise_at(st.step, start=a.noise_start, end=a.noise_end, total_steps=st.total_steps),
                scale=1.0 / a.grad_accum,
                seed=micro_seed(a.seed, g),
                need_final=a.use_soft_labels,
            )
        except Exception as e:  # an optimisation: the first real batch compiles as it would have
            if warmup.testing():
                raise
            st.optimizer.zero_grad(set_to_none=True)
            self.log(
                f"drafter step not traced on a stand-in batch ({type(e).__name__}: {e}); its first batch compiles it"
            )
            return
        self.warmed = took is not None
        if took is not None:
            self.log(f"drafter step traced on a stand-in of micro-batch {g} in {took:.1f}s")

    def log_setup(self, st: DrafterState) -> None:
        a, cfg = self.args, st.cfg
        self.log(
            f"drafter: {sum(p.numel() for p in st.drafter.parameters())} parameters, "
            f"{cfg.num_draft_layers} layer(s), block {cfg.block_size}, target layers {cfg.target_layer_ids}, "
            f"mask token {cfg.mask_token_id}; {st.plan.total} micro-batches over {a.epochs} epoch(s), "
            f"{st.total_steps} optimizer steps ({a.grad_accum} x {self.replicas} micro-batches each); "
            f"setup {time.monotonic() - self.t0:.1f}s"
        )

    # -- weights from elsewhere ----------------------------------------------------------------------------
    def _init_from(self, st: DrafterState, path: str) -> None:
        """--init-drafter: the weights of a drafter directory, cast to the training dtype; nothing else. Ours,
        z-lab's, SpecForge's or speculators' (``trainer.exporting.peers``: a missing ``num_target_layers`` is
        this run's target's)."""
        from safetensors.torch import load_file

        from trainer.exporting import peers
        from trainer.exporting.reader import ReadError
        from trainer.model import config_from_json

        config = os.path.join(path, "config.json")
        try:
            d, fmt = peers.read_config(path, st.cfg.num_target_layers)
            saved = config_from_json(d).to_dict()
        except ReadError as e:
            raise FlagError("--init-drafter", str(e)) from None
        except (
            ValueError,
            KeyError,
            TypeError,
            OverflowError,
            RecursionError,
        ) as e:  # ConfigError and FormatError too: ValueErrors
            raise FlagError(
                "--init-drafter", f"{config}: not a drafter config this trainer builds: {e}"
            ) from None
        check_config(st.cfg, "--init-drafter", path, saved, "pass the flags it was trained with")
        weights = peers.drafter_tensors(
            load_file(os.path.join(path, "model.safetensors"), device=str(self.device))
        )
        st.drafter.load_state_dict(weights, strict=True)  # copied into the training dtype's tensors
        self.log(
            f"drafter weights from {path} ({fmt} layout, {len(weights)} tensors); fresh optimizer, schedule and "
            "data cursor"
        )

    def _resume(self, st: DrafterState, path: str, after: Background | None) -> None:
        """The checkpoint at ``path``: weights, RNGs, step, cursor, estimate window; the optimizer's moments
        in the background, after ``after`` (the target's load in this process: both copy to the GPU from
        host memory, and the target is the one the first step waits for, the moments only its optimizer step)."""
        from safetensors.torch import load_file

        from trainer.model import config_from_json

        with open(os.path.join(path, "drafter", "config.json"), encoding="utf-8") as f:
            saved_cfg = config_from_json(json.load(f)).to_dict()
        advice = "use the flags it was trained with, or --resume none"
        check_config(st.cfg, "--resume", f"checkpoint {path}", saved_cfg, advice)
        # the restricted unpickler only, memory-mapped: the optimizer's moments (2 x the drafter in fp32) go
        # from the file to their device once, in load_state_dict, instead of being read into host memory first
        try:
            state = state_file.load_state(path)
        except state_file.StateFileError as e:
            raise FlagError("--resume", str(e)) from None
        weights = load_file(os.path.join(path, "drafter", "model.safetensors"), device=str(self.device))
        st.drafter.load_state_dict(weights, strict=True)
        # the moments reach the device beside the first step's compile; joined before they are used
        opt_state, optimizer = state["optimizer"], st.optimizer

        def load_optimizer() -> None:
            if after is not None:
                after.wait()
            optimizer.load_state_dict(opt_state)

        check_plan(self.args, state.get("flags") or {}, path)
        check_labels(self.args, state.get("flags") or {}, path)
        st.optimizer_load = Background(load_optimizer, "load-optimizer")
        restore_rng(state["rng"], st.generator)
        st.step, st.cursor = int(state["step"]), int(state["cursor"])
        st.resumed_step = st.step
        st.est_window = [tuple(x) for x in state.get("accept_est_window", [])]
        st.save_seconds = past_save_seconds(self.ckpt_root, state.get("save_seconds", []))
        if state.get("data_fingerprint") != st.ds.fingerprint():
            self.log(
                f"warning: --data-dir content differs from the data checkpoint {path} was trained on; "
                "the data cursor is applied to the new data as is"
            )
        self.log(f"resumed from {path}: step {st.step}, micro-batch {st.cursor}")


def check_config(cfg, flag: str, path: str, saved: dict, advice: str) -> None:
    now = cfg.to_dict()
    diff = sorted(k for k in now if now[k] != saved.get(k))
    if diff:
        raise FlagError(flag, f"{path} has a different drafter config ({', '.join(diff)}); {advice}")


def check_plan(args, saved: dict, path: str) -> None:
    """Refuse a resume whose data plan differs from the checkpoint's (``Plan.RESUME_FLAGS``): its data cursor
    counts micro-batches of the plan it was trained on. A flag the checkpoint predates is not checked, except
    --est-holdout, which was off before it existed."""
    for name in Plan.RESUME_FLAGS:
        was, now = saved.get(name, 0 if name == "est_holdout" else None), getattr(args, name)
        if was is None or was == now:
            continue
        flag = "--" + name.replace("_", "-")
        raise FlagError(
            flag,
            f"checkpoint {path} was trained with {flag} {was}, not {now}: the data plan (which sequences each "
            f"micro-batch holds, in which order) would change under its data cursor; resume with {flag} {was}, "
            "or start fresh with --resume none",
        )


def _labels_text(labels: str, divergence: str | None) -> str:
    return f"--labels {labels}" + (f" --divergence {divergence}" if divergence else "")


def check_labels(args, saved: dict, path: str) -> None:
    """Refuse a resume under other labels or another divergence than the checkpoint was trained with (a
    checkpoint older than ``--labels`` has ``use_soft_labels``: target-dist with kl, else data)."""
    try:
        was = resolve_labels(saved.get("labels"), saved.get("divergence"), bool(saved.get("use_soft_labels")))
    except FlagError:  # not a record this trainer wrote: nothing to compare
        return
    now = (args.labels, args.divergence)
    if was == now:
        return
    raise FlagError(
        "--labels" if was[0] != now[0] else "--divergence",
        f"checkpoint {path} was trained with {_labels_text(*was)}, not {_labels_text(*now)}: resume with "
        f"{_labels_text(*was)}, or start fresh with --resume none (--init-drafter {path}/drafter keeps its weights)",
    )


def restore_rng(rng: dict, generator) -> None:
    """torch's, CUDA's (where the GPUs match), Python's and numpy's RNG and the generator, as saved."""
    import torch

    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError, IndexError):  # saved on a machine with other GPUs
            torch.cuda.set_rng_state_all(rng["cuda"])
    random.setstate(rng["python"])
    state_file.unpack_numpy_rng(rng["numpy"])  # a dict (this trainer), a get_state() tuple (0.1.0's)
    generator.set_state(rng["generator"])
