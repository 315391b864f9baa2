"""``python -m trainer.report RUN_DIR --to tensorboard|mlflow`` on a run recorded before --report-to existed
(tests/data/tiny_run) with hostile lines added: read back with each library's reader, compared with its
metrics.jsonl; bad input and a missing library give their exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trainer_run import ROOT, env
from trainer import report

pytestmark = pytest.mark.e2e  # each test starts a real process

TINY_RUN = ROOT / "tests" / "data" / "tiny_run"
EVAL = {"t": 1796020649.0, "kind": "eval", "step": 20, "accept_len": 1.25, "accept_len_se": 0.05,
        "per_position": [0.2, 0.05], "prompts": 2, "checkpoint": "/tmp/e/run/checkpoints/step_00000020"}  # fmt: skip
HOSTILE = [
    b"not json\n",
    b"[1, 2]\n",
    b'{"kind": 7}\n',
    b'{"kind": "step", "pad": "' + b"x" * (1 << 21) + b'"}\n',
]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(TINY_RUN, d)
    with open(d / "metrics.jsonl", "ab") as f:
        for line in [
            *HOSTILE,
            json.dumps(EVAL).encode() + b"\n",
            b'{"t": 1.0, "kind": "st',
        ]:  # a torn last line
            f.write(line)
    return d


def _report(run_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in env(**extra).items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    return subprocess.run(
        [sys.executable, "-m", "trainer.report", str(run_dir), *args],
        cwd=ROOT, env=e, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _recorded(kind: str) -> list[dict]:
    recs = [json.loads(x) for x in (TINY_RUN / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == kind]


def test_export_to_tensorboard(run_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = _report(run_dir, "--to", "tensorboard")
    assert done.returncode == 0, done.stderr
    n_steps, n_tp = len(_recorded("step")), len(_recorded("throughput"))
    assert f"exported {n_steps + n_tp + 7 + 1} record(s) (eval: 1, event: 7, step: {n_steps}" in done.stdout
    assert "skipped 5 malformed or over-long line(s)" in done.stdout  # 4 hostile lines and the torn one
    ea = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    loss = [(s.step, s.value) for s in ea.Scalars("train/loss")]
    assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in _recorded("step")]
    assert len(ea.Scalars("throughput/tok_s/drafter")) == n_tp
    assert [(s.step, s.value) for s in ea.Scalars("eval/accept_len")] == [(20, 1.25)]
    assert "eval/accept_len_est_error" not in ea.Tags()["scalars"]  # its steps had no accept_len_est yet
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    content = ea.PluginTagToContent("hparams")[metadata.SESSION_START_INFO_TAG]
    hp = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hp["epochs"].string_value == "50" and hp["block_size"].string_value == "8"  # run.json's argv

    again = _report(run_dir, "--to", "tensorboard")  # the curves would double: refused
    assert again.returncode == 2 and "already holds event files" in again.stderr
    other = _report(run_dir, "--to", "tensorboard", "--logdir", str(run_dir / "tb2"))
    assert other.returncode == 0 and list((run_dir / "tb2").glob("events.out.tfevents.*"))


def test_export_to_mlflow(run_dir, monkeypatch):
    pytest.importorskip("mlflow")
    done = _report(run_dir, "--to", "mlflow")
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when allowed
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # and the reader sends nothing anywhere
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("dflash")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["dflash.source"] == "export" and run.info.run_id in done.stdout
    assert run.info.status == "KILLED"  # the recorded run was stopped by SIGINT
    assert run.data.params["epochs"] == "50" and run.data.params["version"] == "0.1.0"
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert loss == [(r["step"], r["loss"]) for r in _recorded("step")]
    se = client.get_metric_history(run.info.run_id, "eval/accept_len_se")
    assert [(m.step, m.value) for m in se] == [(20, 0.05)]


def test_bad_input_and_a_missing_library(run_dir, tmp_path, monkeypatch, capsys):
    assert _report(tmp_path / "nope", "--to", "tensorboard").returncode == 2
    assert _report(run_dir, "--to", "wandb").returncode == 2  # argparse: not an export target
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(run_dir / "metrics.jsonl", linked / "metrics.jsonl")
    done = _report(linked, "--to", "tensorboard")
    assert done.returncode == 2 and "metrics.jsonl" in done.stderr  # a symlink is not followed
    assert not (linked / "tensorboard").exists()
    (tmp_path / "empty").mkdir()
    assert _report(tmp_path / "empty", "--to", "tensorboard").returncode == 2

    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` fails as when it is not installed
    assert report.main([str(run_dir), "--to", "mlflow"]) == 3
    assert "pip install '.[mlflow]'" in capsys.readouterr().err
    assert not (run_dir / "mlruns").exists()
