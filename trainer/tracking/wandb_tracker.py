"""Weights & Biases: offline by default, the run's files under RUN_DIR/wandb/ (``wandb sync RUN_DIR/wandb/offline-run-*``
uploads them later; ``wandb leet RUN_DIR/wandb`` shows them in a terminal).

Online only when the user says so through W&B's own settings: ``WANDB_MODE=online`` (with ``WANDB_API_KEY`` or a
``wandb login``), ``WANDB_PROJECT`` / ``WANDB_ENTITY``, ``WANDB_DIR``. Offline, nothing is sent anywhere: the
system-metrics sampler and machine-info probes are off and so is W&B's error reporting.

W&B's step must grow: every point is logged at the current training step (``Point.now``); an ``eval`` record,
which arrives after later steps, carries its own step as ``eval/step``, the x axis of the ``eval/*`` charts
(``define_metric``). A resumed trainer continues the same run (its id in tracking.json, ``resume="allow"``): offline,
each start writes its own ``offline-run-*-ID`` folder of that one run id.
"""

from __future__ import annotations

import os
import secrets

from trainer.run.rundir import own_dir
from trainer.tracking.base import Context, Tracker
from trainer.tracking.records import Point

DIR_ENV = "WANDB_DIR"
PROJECT = "dflash"


class WandB(Tracker):
    name = "wandb"

    def __init__(self) -> None:
        self._run = None
        self._wandb = None

    def prepare(self) -> None:
        if "WANDB_MODE" not in os.environ:
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")

    def open(self, ctx: Context) -> None:
        offline = "WANDB_MODE" not in os.environ
        import wandb

        self._wandb = wandb
        stored = ctx.stored(self.name) or {}
        run_id = str(stored.get("id") or secrets.token_hex(4))
        settings = {"console": "off", "silent": True}
        if offline:
            settings.update(x_disable_stats=True, x_disable_machine_info=True)
        if not os.environ.get(DIR_ENV):
            own_dir(os.path.join(ctx.run_dir, "wandb"))  # RUN/wandb: never through a planted link
        self._run = wandb.init(
            dir=None if os.environ.get(DIR_ENV) else ctx.run_dir,
            project=None if os.environ.get("WANDB_PROJECT") else PROJECT,
            name=ctx.run_name,
            id=run_id,
            resume="allow",
            mode="offline" if offline else None,
            config=ctx.settings,
            allow_val_change=True,  # a restart may change settings (--resume names the checkpoint)
            tags=[f"{k}={v}" for k, v in ctx.notes.items()] or None,
            settings=wandb.Settings(**settings),
        )
        self._run.define_metric("eval/*", step_metric="eval/step")
        self.where = os.path.dirname(str(self._run.dir))  # the offline-run-* folder (run.dir is its files/)
        ctx.store(self.name, {"id": run_id, "mode": "offline" if offline else "online"})

    def log(self, points: list[Point]) -> None:
        for p in points:
            data: dict = dict(p.scalars)
            if p.kind == "eval":
                data["eval/step"] = p.step
            if p.text is not None:
                self._run.summary["last_event"] = p.text
            for k, v in p.labels.items():
                self._run.summary[k] = v
            if data:
                self._run.log(data, step=p.now)

    def close(self, status: str | None) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if status in (None, "finished", "killed") else 1)
        if self._wandb is not None:
            self._wandb.teardown()  # its service process ends now (the trainer exits without atexit hooks)
