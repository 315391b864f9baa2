"""``--report-to tensorboard,wandb,mlflow`` on the real tiny trainer, read back with each library's own reader and
compared with metrics.jsonl: TensorBoard's EventAccumulator, MLflow's MlflowClient on the file store, W&B's
``wandb leet inspect --json`` on the offline run files. Run A is stopped by SIGINT and resumed (`--resume auto`):
every tracker goes on in the same run. Run B has a tracker raising mid-run: it is off, said once, and the run
trains on to the end while the other tracker gets every record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.trainer_run import (
    Trainer,
    events,
    records,
    session_members,
    steps,
    tiny_flags,
    wait_for_step,
)

pytestmark = pytest.mark.e2e
for _lib in ("tensorboard", "wandb", "mlflow"):
    pytest.importorskip(_lib)

N, N_B = 8, 20  # steps of run A (stopped at 3 or later, resumed to N) and of run B
ALL = ("--report-to", "tensorboard,wandb,mlflow")


@dataclass
class Runs:
    a: Path
    b: Path
    first_tracking: dict  # run A's tracking.json after its first part
    a_pids: list[int]
    b_pid: int
    b_output: str


@pytest.fixture(scope="module")
def runs(tiny_assets, tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("tracking")
    a, b = root / "a", root / "b"
    evals = (
        "--eval-data",
        str(tiny_assets / "data"),
        "--eval-every",
        "100",
        "--eval-prompts",
        "2",
        "--eval-new-tokens",
        "8",
    )  # fmt: skip - a finished run evaluates its last checkpoint
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_"))]:
            mp.delenv(k)  # the defaults: offline, under the run directory
        first = Trainer(tiny_flags(tiny_assets, a, "--max-steps", str(N), "--seed", "3", *ALL))
        failing = Trainer(
            tiny_flags(tiny_assets, b, "--max-steps", str(N_B), "--report-to", "tensorboard,mlflow"),
            DFLASH_TEST_TRACKER_RAISE="tensorboard:2",
        )
        wait_for_step(a, 3, first)
        first.signal(signal.SIGINT)
        assert first.wait() == 0, first.output
        first_tracking = json.loads((a / "tracking.json").read_text())
        second = Trainer(tiny_flags(tiny_assets, a, "--max-steps", str(N), "--seed", "3", *ALL, *evals))
        assert second.wait(180) == 0, second.output
        assert failing.wait(180) == 0, failing.output
    return Runs(a, b, first_tracking, [first.proc.pid, second.proc.pid], failing.proc.pid, failing.output)


def _steps(run_dir: Path) -> dict[int, dict]:
    return {s["step"]: s for s in steps(run_dir)}


def _kind(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(run_dir) if r["kind"] == kind]


def _drafter_tok_s(run_dir: Path) -> list[float]:
    return [
        sum(d["tok_s"] for d in r["devices"] if d["role"] == "drafter") for r in _kind(run_dir, "throughput")
    ]


def _accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def test_tensorboard_holds_every_record_and_the_settings(runs):
    ea = _accumulator(runs.a / "tensorboard")
    ref = _steps(runs.a)
    assert sorted(ref) == list(range(1, N + 1))  # the resumed run went on where the stop saved
    for tag, field in (("train/loss", "loss"), ("train/lr", "lr"), ("train/accept_len_est", "accept_len_est"),
                       ("train/noise", "noise"), ("train/grad_norm", "grad_norm")):  # fmt: skip
        got = {s.step: s.value for s in ea.Scalars(tag)}
        assert sorted(got) == sorted(ref), tag
        assert [got[k] for k in sorted(ref)] == pytest.approx([ref[k][field] for k in sorted(ref)], rel=1e-6)
    for k in range(1, len(ref[1]["acc"]) + 1):
        got = {s.step: s.value for s in ea.Scalars(f"train/acc/{k:02d}")}
        assert [got[s] for s in sorted(ref)] == pytest.approx(
            [ref[s]["acc"][k - 1] for s in sorted(ref)], rel=1e-6
        )
    tok_s = [s.value for s in ea.Scalars("throughput/tok_s/drafter")]
    assert tok_s == pytest.approx(_drafter_tok_s(runs.a), rel=1e-6) and len(tok_s) > 0
    assert len(ea.Scalars("queue/depth")) == len(_kind(runs.a, "throughput"))

    ev = _kind(runs.a, "eval")
    assert [e["step"] for e in ev] == [N]
    got = [(s.step, s.value) for s in ea.Scalars("eval/accept_len")]
    assert got == [(N, pytest.approx(ev[0]["accept_len"], rel=1e-6))]
    err = ea.Scalars("eval/accept_len_est_error")[0].value
    assert err == pytest.approx(ref[N]["accept_len_est"] - ev[0]["accept_len"], rel=1e-5)

    texts = [t.tensor_proto.string_val[0].decode() for t in ea.Tensors("events")]
    assert [x.split(" ", 1)[0] for x in texts] == [e["name"] for e in events(runs.a)]
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    content = ea.PluginTagToContent("hparams")[metadata.SESSION_START_INFO_TAG]
    hp = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hp["lr"].number_value == 1e-2 and hp["report_to"].string_value == "tensorboard,wandb,mlflow"
    assert (
        len(list((runs.a / "tensorboard").glob("events.out.tfevents.*"))) == 2
    )  # one file per start, one dir


def _mlflow(tracking: dict, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when allowed
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # and the reader sends nothing anywhere
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking["mlflow"]["tracking_uri"])


def test_mlflow_continues_one_run_with_every_record(runs, monkeypatch):
    tracking = json.loads((runs.a / "tracking.json").read_text())
    run_id = tracking["mlflow"]["run_id"]
    assert run_id == runs.first_tracking["mlflow"]["run_id"]
    assert tracking["mlflow"]["tracking_uri"] == (runs.a / "mlruns").resolve().as_uri()
    client = _mlflow(tracking, monkeypatch)
    run = client.get_run(run_id)
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]
    ref = _steps(runs.a)
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    assert loss == [(k, ref[k]["loss"]) for k in sorted(ref)]
    tok_s = [m.value for m in sorted(client.get_metric_history(run_id, "throughput/tok_s/drafter"),
                                     key=lambda m: m.timestamp)]  # fmt: skip
    assert sorted(tok_s) == sorted(_drafter_tok_s(runs.a))
    ev = _kind(runs.a, "eval")[0]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/accept_len")] == [
        (N, ev["accept_len"])
    ]
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.01" and run.data.params["resume"] == "none"
    k = next(e["step"] for e in events(runs.a) if e["name"] == "checkpoint_saved")  # the stop's save
    assert run.data.tags["param.resume"].endswith(
        f"step_{k:08d}"
    )  # a changed setting: a tag, MLflow keeps params
    assert run.data.tags["event.stopped"].startswith('stopped {"exit_code": 0, "reason": "finished"')


def _wandb_records(path: Path) -> list[dict]:
    """W&B's own reader of an offline run's transaction log: ``wandb leet inspect --json``."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True, text=True, timeout=120, check=True, cwd=path.parent,
        env={**os.environ, "WANDB_ERROR_REPORTING": "false", "WANDB_MODE": "offline"},
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_wandb_offline_files_hold_one_run_with_every_record(runs):
    run_id = runs.first_tracking["wandb"]["id"]
    assert json.loads((runs.a / "tracking.json").read_text())["wandb"] == {"id": run_id, "mode": "offline"}
    files = sorted((runs.a / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(
        f.name == f"run-{run_id}.wandb" for f in files
    )  # one run, one file per start
    parts = [_wandb_records(f) for f in files]
    rows = [[r["history"]["item"] for r in part if r["type"] == "history"] for part in parts]
    assert max(x["_step"] for x in rows[0]) <= min(x["_step"] for x in rows[1])  # steps go on
    ref = _steps(runs.a)
    loss = {x["_step"]: x["train/loss"] for part in rows for x in part if "train/loss" in x}
    assert loss == {k: pytest.approx(ref[k]["loss"], rel=1e-9) for k in ref}
    ev = _kind(runs.a, "eval")[0]
    evals = [x for part in rows for x in part if "eval/accept_len" in x]
    assert [(x["eval/step"], x["eval/accept_len"]) for x in evals] == [(N, pytest.approx(ev["accept_len"]))]
    for part in parts:
        run = next(r["run"] for r in part if r["type"] == "run")
        assert run["run_id"] == run_id and run["project"] == "dflash" and run["display_name"] == "a"
        assert run["config"]["update"]["lr"] == 1e-2
        assert next(r["exit"] for r in part if r["type"] == "exit").get("exit_code", 0) == 0


def test_a_tracker_raising_mid_run_leaves_the_run_training(runs, monkeypatch):
    recs = records(runs.b)
    assert sorted(_steps(runs.b)) == list(range(1, N_B + 1))
    assert recs[-1]["name"] == "stopped" and recs[-1]["reason"] == "finished"
    said = [x for x in runs.b_output.splitlines() if "failed and is off" in x]
    assert len(said) == 1 and "tracking: tensorboard" in said[0] and "DFLASH_TEST_TRACKER_RAISE" in said[0]
    failed = [i for i, r in enumerate(recs) if r.get("name") == "tracker_failed"]
    assert len(failed) == 1 and recs[failed[0]]["tracker"] == "tensorboard"
    assert any(r["kind"] == "step" for r in recs[failed[0] :])  # it trained on after the failure
    tracking = json.loads((runs.b / "tracking.json").read_text())
    loss = _mlflow(tracking, monkeypatch).get_metric_history(tracking["mlflow"]["run_id"], "train/loss")
    assert sorted(m.step for m in loss) == list(range(1, N_B + 1))  # the other tracker got every step
    tb = _accumulator(runs.b / "tensorboard").Tags()["scalars"]
    assert "train/loss" not in tb or len(_accumulator(runs.b / "tensorboard").Scalars("train/loss")) < N_B


def test_nothing_is_left_running(runs):
    for pid in [*runs.a_pids, runs.b_pid]:
        assert session_members(pid) == []  # W&B's service process ended with the trainer
