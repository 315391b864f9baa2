"""--init-drafter: a run starts from another run's exported drafter (its weights exactly, a fresh step and
cursor), refuses one whose config differs from its flags, and a run that finds its own checkpoint resumes it."""

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

from tests.support.trainer_run import ROOT, env, tiny_flags
from trainer.run import checkpoint


def _steps(run):
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r.get("kind") == "step"]


def _start(tiny, out, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.pipeline", *tiny_flags(tiny, out, *extra)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(proc: subprocess.Popen, check=True) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def _run(tiny, out, *extra, check=True):
    return _done(_start(tiny, out, *extra), check=check)


def test_init_drafter_starts_from_the_weights_and_checks_the_config(tiny_assets, tmp_path):
    _run(tiny_assets, tmp_path / "a", "--max-steps", "3", "--resume", "none", "--export-fp32")
    src = checkpoint.latest(str(tmp_path / "a" / "checkpoints")) + "/export"
    # lr 1e-30: a step moves no fp32 weight (far below their resolution), so the result shows what was loaded
    b = _start(tiny_assets, tmp_path / "b", "--max-steps", "2", "--init-drafter", src, "--lr", "1e-30")
    # a config that differs from the flags (checked while run b goes on: independent runs, one startup's time)
    bad = _start(tiny_assets, tmp_path / "c", "--num-draft-layers", "2", "--init-drafter", src)
    p = _done(b)
    assert "drafter weights from" in p.stdout + p.stderr
    ck = checkpoint.latest(str(tmp_path / "b" / "checkpoints"))
    assert ck.endswith("step_00000002")  # its own schedule from step 0, not the source's step 3
    want, got = load_file(src + "/model.safetensors"), load_file(ck + "/drafter/model.safetensors")
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    a, b = _steps(tmp_path / "a"), _steps(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2]
    assert b[0]["loss"] < a[0]["loss"]  # the same first batch, on trained weights instead of a random init

    # the config that differs from the flags: exit 2 naming the flag and the field
    bad = _done(bad, check=False)
    assert bad.returncode == 2 and "--init-drafter" in bad.stderr and "num_draft_layers" in bad.stderr
    missing = _run(tiny_assets, tmp_path / "d", "--init-drafter", str(tmp_path), check=False)
    assert missing.returncode == 2 and "config.json" in missing.stderr

    # run b again: it resumes its own checkpoint, the init weights are not read again
    p = _run(tiny_assets, tmp_path / "b", "--max-steps", "3", "--init-drafter", src, "--lr", "1e-30")
    assert "resuming this run's own checkpoint" in p.stdout + p.stderr
