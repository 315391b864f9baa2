"""The drafter's step loop, shared by the single-process pipeline and drafter workers.

``Trainer`` runs optimizer steps over micro-batches taken from the ``HiddenStateQueue`` of its hidden-state
source (``queue.get(g, should_stop)``; runtime/sources.py: target threads in one process, or a drafter
worker's point-to-point receiver), chosen once at start; it asks the source, never the mode. Its parts:
``DrafterBuild`` (runtime/build.py: the drafter's setup), ``Checkpointer`` (runtime/checkpointing.py),
``DrafterState`` (runtime/drafter_state.py: what it trains) and ``StepMetrics`` (runtime/step_metrics.py: a step's
metrics by name). With ``replicas`` drafter replicas (DDP) an optimizer step consumes
``grad_accum * replicas`` consecutive micro-batches: replica ``r`` takes ``c0 + j * replicas + r`` for
``j < grad_accum``. Each micro-batch's anchors and noise come from a generator seeded by ``(seed, g)``
alone, so D replicas with DDP averaging compute what one process with ``--grad-accum D * A`` does over the
same micro-batches (the same checkpoints, too: a run may resume under the other mode).
"""

from __future__ import annotations

import numpy as np

from trainer.run.flags import FlagError
from trainer.run.schedule import lr_at, noise_at
from trainer.runtime import compile_cache
from trainer.runtime.build import DrafterBuild
from trainer.runtime.checkpointing import Checkpointer
from trainer.runtime.common import EXIT_ERROR, EXIT_NAN, EXIT_OK, EXIT_SAVE_FAILED, log, micro_seed
from trainer.runtime.startup_steps import first_batch_events, startup_phase
from trainer.runtime.step_metrics import EST_WINDOW, StepMetrics, running_estimate

NAN_LIMIT = 5  # consecutive NaN steps that stop the run


class Trainer:
    """The drafter side of a run: replica ``replica`` of ``replicas`` on ``device``, fed by ``source`` (a
    runtime.sources.HiddenStateSource). ``stop``: the run's StopControl or a worker's stand-in (the
    checkpoints' events go out after its pending ones); ``writer``: metrics.jsonl or a worker's relay to the
    launcher; ``startup``: a run.startup.StartupEvents (start-up events until the first step) or None;
    ``mega_name``: this process's compile mega-cache (runtime/compile_cache.py)."""

    def __init__(
        self,
        args,
        source,
        stop,
        writer,
        run_dir: str,
        resume_path: str | None,
        *,
        device: str,
        replica: int = 0,
        replicas: int = 1,
        log=log,
        startup=None,
        mega_name: str = "single",
    ):
        self.args, self.source, self.writer, self.log = args, source, writer, log
        self.run_dir, self.replica, self.replicas = run_dir, replica, replicas
        self.saver = replica == 0  # writes checkpoints and step records
        self.trained = False  # an optimizer step was applied in this process
        self.ckpt = Checkpointer(args, run_dir, resume_path, stop, writer, log)
        self.build = DrafterBuild(
            args,
            device,
            resume_path,
            self.ckpt.ckpt_root,
            log,
            replica=replica,
            replicas=replicas,
            startup=startup,
            mega_name=mega_name,
        )
        self.state = None  # a runtime.state.DrafterState, once set up
        self.role = None  # the runtime.roles.DrafterRole that runs its micro-steps

    def setup(self) -> None:
        """The drafter built, with what its source needs beside it (runtime/sources.py)."""
        self.state, self.role = self.source.setup(self.build)

    def save(self) -> bool:
        """A checkpoint of the current step (runtime/checkpointing.py); False when its write failed."""
        return self.ckpt.save(self.state)

    # -- the step loop -------------------------------------------------------------------------------------
    def train(self) -> tuple[int, str]:
        st, a = self.state, self.args
        self._check_data_left()
        self.build.caches_loaded()
        queue = self.source.start(st.plan, st.cursor, st.data_end(a.grad_accum, self.replicas))
        startup = self.build.startup
        startup_phase(startup, "queue_filling", depth=queue.depth(), capacity=queue.capacity)
        first = startup is not None
        nan_streak = 0
        while st.step < st.total_steps and not self.source.stop_now():
            noise = noise_at(st.step, start=a.noise_start, end=a.noise_end, total_steps=st.total_steps)
            lr = lr_at(st.step, base_lr=a.lr, total_steps=st.total_steps, warmup_ratio=a.warmup_ratio)
            m = self._accumulate(queue, noise, self.poisoned(st.step + 1), first)
            if m is None:  # stopped mid-step
                break
            st.step += 1
            n = a.grad_accum * self.replicas
            if np.isfinite(m.loss / n) and np.isfinite(m.grad_norm):
                nan_streak = 0
                self._apply(m, lr, noise)
            else:
                nan_streak += 1
                if self._skip(m, nan_streak):
                    return EXIT_NAN, "nan"
            if first:
                first = False
                if self.saver:
                    startup.first_step(st.step)
                    compile_cache.save_mega(self.build.mega_name)
            periodic = self.saver and st.step < st.total_steps and not self.source.stop_asked()
            if periodic and self.ckpt.save_due(st.step) and not self.save():  # a stop saves once, below
                self.log("training goes on; the next save tries again")
        return self._finish()

    def _check_data_left(self) -> None:
        st, a = self.state, self.args
        need = (st.total_steps - st.step) * a.grad_accum * self.replicas
        if st.step < st.total_steps and st.cursor + need > st.plan.total:
            raise FlagError(
                "--data-dir",
                f"the checkpoint's data cursor ({st.cursor}) plus {need} micro-batches "
                f"to go exceeds the {st.plan.total} this data gives",
            )

    def poisoned(self, step: int) -> bool:
        """Whether step ``step``'s loss is made NaN: never; a seam where tests make a run diverge."""
        return False

    def _accumulate(self, queue, noise: float, poisoned: bool, first: bool) -> StepMetrics | None:
        """One optimizer step's micro-batches through the drafter (gradients accumulated, clipped); their
        metrics summed over the replicas, read back. None: a stop mid-step (the partial gradient dropped, the
        generators and the cursor rewound to the step's start)."""
        import torch

        from trainer.runtime.hidden_queue import Stopped

        st, a = self.state, self.args
        A, D = a.grad_accum, self.replicas
        snap = (st.generator.get_state(), torch.get_rng_state())
        g0 = st.cursor
        micro, tokens, abandoned = [], 0, False
        try:
            for k in range(A):
                g = g0 + k * D + self.replica
                hb = queue.get(g, self.source.abort_check)
                if first and k == 0 and not self.build.warmed:  # else it compiled on a stand-in batch
                    first_batch_events(self.build.startup, self.build.device)
                micro.append(
                    self.role.micro_step(
                        hb, noise, 1.0 / A, poison=poisoned, seed=micro_seed(a.seed, g), sync=k == A - 1
                    )
                )
                tokens += hb.tokens
                del hb
                if self.source.stop_mid_step() and k < A - 1:
                    abandoned = True
                    break
        except Stopped:
            abandoned = True
        if abandoned:
            self.role.discard()
            st.generator.set_state(snap[0])
            torch.set_rng_state(snap[1])
            st.cursor = g0
            return None
        st.cursor = g0 + A * D
        norm = self.role.clip()
        sums = StepMetrics.of(micro, tokens)
        return sums.unpack(self.source.sum_metrics(sums.pack()), norm)

    def _apply(self, m: StepMetrics, lr: float, noise: float) -> None:
        """A finite step: AdamW at ``lr``, the running estimate, the step record and its log line."""
        st = self.state
        st.optimizer_ready()
        self.role.apply(lr)
        st.est_window = [*st.est_window, (m.chain_sum, float(m.blocks), m.walk_tokens, m.walk_steps)][
            -EST_WINDOW:
        ]
        self.trained = True
        if self.saver:
            self._record(m, lr, noise)

    def _record(self, m: StepMetrics, lr: float, noise: float) -> None:
        st, a = self.state, self.args
        n = a.grad_accum * self.replicas
        loss, acc, accept = m.loss / n, [x / n for x in m.acc], m.accept_len / n
        est, est_uniform = running_estimate(st.est_window)
        epoch = st.plan.epoch_progress(st.cursor)
        self.writer.write(
            "step",
            step=st.step,
            total_steps=st.total_steps,
            epoch=epoch,
            loss=loss,
            acc=acc,
            accept_len=accept,
            accept_len_est=est,
            accept_len_est_step=m.walk_tokens / m.walk_steps if m.walk_steps else None,
            # judged by the target's own argmax where soft labels carry its logits, else the data
            accept_len_est_vs="target" if a.use_soft_labels else "data",
            # the blocks the walk read: the measuring runs (--est-anchors; in held-out sequences with
            # --est-holdout) or the training ones
            accept_len_est_anchors=("heldout_runs" if a.est_holdout else "runs")
            if a.est_anchors
            else "training",
            accept_len_est_uniform=est_uniform,
            lr=lr,
            grad_norm=m.grad_norm,
            tokens=m.tokens,
            blocks=m.blocks,
            noise=noise,
            **{k: v / n for k, v in m.selector.items()},
        )
        if st.step % a.log_every == 0 or st.step == st.total_steps:
            self.log(
                f"step {st.step}/{st.total_steps} epoch {epoch:.3f} loss {loss:.4f} accept_est {est or 0:.2f} "
                f"acc1 {acc[0]:.3f} lr {lr:.3g} gnorm {m.grad_norm:.3g} tokens {m.tokens}"
            )

    def _skip(self, m: StepMetrics, streak: int) -> bool:
        """A non-finite step: dropped. True after NAN_LIMIT in a row (the last good weights saved)."""
        st = self.state
        self.role.discard()
        if self.saver:
            self.writer.event("nan_skipped", step=st.step)
        loss = m.loss / (self.args.grad_accum * self.replicas)
        self.log(
            f"step {st.step}: non-finite loss or gradient ({loss}, {m.grad_norm}): step skipped "
            f"({streak} in a row)"
        )
        if streak < NAN_LIMIT:
            return False
        self.log(f"{NAN_LIMIT} non-finite steps in a row: saving the last good weights and stopping")
        self.source.close()
        if self.saver:
            self.save()
        return True

    def _finish(self) -> tuple[int, str]:
        """After the last step or a stop: the producers stopped, the one checkpoint, the exit status."""
        self.source.close()
        saved = self.save() if self.saver else True
        if self.source.failed():
            return EXIT_ERROR, "error"
        if not saved:
            return EXIT_SAVE_FAILED, "checkpoint_failed"
        if self.source.stop_asked():
            return EXIT_OK, "signal"
        return EXIT_OK, "finished"
