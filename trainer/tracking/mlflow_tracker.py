"""MLflow (the ``mlflow-skinny`` client): a file store under RUN_DIR/mlruns/ by default (``mlflow ui
--backend-store-uri RUN_DIR/mlruns`` shows it), a server or database when the user sets ``MLFLOW_TRACKING_URI``
(``MLFLOW_EXPERIMENT_NAME`` names the experiment; default ``dflash``).

MLflow 3 keeps the file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``: the
trainer sets that (and ``MLFLOW_DISABLE_TELEMETRY=true``: nothing leaves the machine) for its own default store
only, never over the user's values. Points go through ``MlflowClient.log_batch`` (at most 1000 metrics and 100
tags a call); settings are params, and on a resumed run the params that changed (``resume`` names the
checkpoint) become ``param.NAME`` tags, as MLflow refuses to change a param. The run's status follows the
``stopped`` event: FINISHED, KILLED (a stop by signal) or FAILED; a resumed run is RUNNING again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from trainer.run.rundir import own_dir
from trainer.tracking.base import Context, Tracker, hparams
from trainer.tracking.records import Point

STORE = "mlruns"
EXPERIMENT = "dflash"
MAX_VALUE = 6000  # MLflow's param value limit
_STATUS = {"finished": "FINISHED", "killed": "KILLED", "failed": "FAILED", None: "FINISHED"}


def tracking_uri(run_dir: str) -> str:
    """``MLFLOW_TRACKING_URI`` where set, else RUN_DIR/mlruns as a file store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or Path(run_dir, STORE).resolve().as_uri()


class MLflow(Tracker):
    name = "mlflow"

    def __init__(self) -> None:
        self._c = None
        self.run_id: str | None = None

    def prepare(self) -> None:
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # the default file store: allowed, no telemetry
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    def open(self, ctx: Context) -> None:
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            own_dir(os.path.join(ctx.run_dir, STORE))  # RUN/mlruns: never through a planted link
        uri = tracking_uri(ctx.run_dir)
        from mlflow.tracking import MlflowClient

        self._c = MlflowClient(tracking_uri=uri)
        stored = ctx.stored(self.name) or {}
        if stored.get("run_id") and stored.get("tracking_uri") == uri and self._exists(stored["run_id"]):
            self.run_id = str(stored["run_id"])
            self._c.update_run(self.run_id, status="RUNNING")
        else:
            if stored:
                ctx.log(f"tracking: mlflow: the stored run {stored.get('run_id')} is not in {uri}: a new run")
            exp = self._experiment()
            tags = {"dflash.run_dir": os.path.abspath(ctx.run_dir), **ctx.notes}
            self.run_id = self._c.create_run(exp, run_name=ctx.run_name, tags=tags).info.run_id
        self._params(hparams(ctx.settings))
        self.where = f"{uri} (run {self.run_id})"
        ctx.store(self.name, {"run_id": self.run_id, "tracking_uri": uri})

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self._c.get_run(run_id)
        except MlflowException:
            return False
        return True

    def _experiment(self) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        exp = self._c.get_experiment_by_name(name)
        return exp.experiment_id if exp is not None else self._c.create_experiment(name)

    def _params(self, hp: dict) -> None:
        from mlflow.entities import Param, RunTag

        have = self._c.get_run(self.run_id).data.params
        new = {k: str(v)[:MAX_VALUE] for k, v in hp.items()}
        params = [Param(k, v) for k, v in new.items() if k not in have]
        changed = [RunTag(f"param.{k}", v) for k, v in new.items() if k in have and have[k] != v]
        for i in range(0, max(len(params), len(changed)), 100):
            self._c.log_batch(self.run_id, params=params[i : i + 100], tags=changed[i : i + 100])

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics, tags = [], {}
        for p in points:
            ms = int((p.t or time.time()) * 1000)
            metrics.extend(Metric(k, v, ms, p.step) for k, v in p.scalars.items())
            tags.update({f"label.{k}": v for k, v in p.labels.items()})
            if p.event is not None and p.text is not None:
                tags[f"event.{p.event}"] = p.text
        tag_list = [RunTag(k, v[:MAX_VALUE]) for k, v in tags.items()]
        for i in range(0, len(metrics), 1000):
            self._c.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for i in range(0, len(tag_list), 100):
            self._c.log_batch(self.run_id, tags=tag_list[i : i + 100])

    def close(self, status: str | None) -> None:
        if self._c is not None and self.run_id is not None:
            self._c.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))
