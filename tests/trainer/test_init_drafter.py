"""--init-drafter: a run starts from another run's exported drafter (its weights exactly, a fresh step and
cursor), refuses one whose config differs from its flags, and a run that finds its own checkpoint resumes it.
The trainer runs in this process (tests/support/trainer_run.py ``run_in_process``)."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.support.trainer_run import run_in_process, tiny_flags
from trainer.run import checkpoint


def _steps(run):
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r.get("kind") == "step"]


def _run(tiny, out, capfd, *extra, check=True) -> tuple[int, str, str]:
    """The trainer in this process: (exit code, stdout, stderr)."""
    capfd.readouterr()
    rc = run_in_process(tiny_flags(tiny, out, *extra))
    so, se = capfd.readouterr()
    if check:
        assert rc == 0, so + se
    return rc, so, se


def test_init_drafter_starts_from_the_weights_and_checks_the_config(tiny_assets, tmp_path, capfd):
    _run(tiny_assets, tmp_path / "a", capfd, "--max-steps", "3", "--resume", "none", "--export-fp32")
    src = checkpoint.latest(str(tmp_path / "a" / "checkpoints")) + "/export"
    # lr 1e-30: a step moves no fp32 weight (far below their resolution), so the result shows what was loaded
    _, so, se = _run(
        tiny_assets, tmp_path / "b", capfd, "--max-steps", "2", "--init-drafter", src, "--lr", "1e-30"
    )
    assert "drafter weights from" in so + se
    ck = checkpoint.latest(str(tmp_path / "b" / "checkpoints"))
    assert ck.endswith("step_00000002")  # its own schedule from step 0, not the source's step 3
    want, got = load_file(src + "/model.safetensors"), load_file(ck + "/drafter/model.safetensors")
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    a, b = _steps(tmp_path / "a"), _steps(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2]
    assert b[0]["loss"] < a[0]["loss"]  # the same first batch, on trained weights instead of a random init

    # a config that differs from the flags: exit 2 naming the flag and the field
    rc, _, se = _run(
        tiny_assets, tmp_path / "c", capfd, "--num-draft-layers", "2", "--init-drafter", src, check=False
    )
    assert rc == 2 and "--init-drafter" in se and "num_draft_layers" in se
    rc, _, se = _run(tiny_assets, tmp_path / "d", capfd, "--init-drafter", str(tmp_path), check=False)
    assert rc == 2 and "config.json" in se

    # run b again: it resumes its own checkpoint, the init weights are not read again
    _, so, se = _run(
        tiny_assets, tmp_path / "b", capfd, "--max-steps", "3", "--init-drafter", src, "--lr", "1e-30"
    )
    assert "resuming this run's own checkpoint" in so + se


def test_a_hostile_init_drafter_config_is_one_line_exit_2(tiny_assets, tmp_path, capfd):
    """A config.json of 10**12 layers, a hidden size whose drafter outgrows the machine, or a size of 1e999: each
    is refused by the sizes' bounds before anything is allocated (never a MemoryError or OverflowError)."""
    _run(tiny_assets, tmp_path / "a", capfd, "--max-steps", "1", "--resume", "none")
    src = Path(checkpoint.latest(str(tmp_path / "a" / "checkpoints"))) / "export"
    good = json.loads((src / "config.json").read_text())
    bad = [
        ({"num_hidden_layers": 10**12}, "num_draft_layers must be an integer in 1..1024"),
        ({"hidden_size": 200_000}, "more than this machine's memory"),
        ({"intermediate_size": float("inf")}, "not a finite integer"),
    ]
    for i, (change, said) in enumerate(bad):
        d = tmp_path / f"bad{i}"
        d.mkdir()
        cfg = {k: v for k, v in {**good, **change}.items() if k != "layer_types"}
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
        rc, _, se = _run(tiny_assets, tmp_path / f"run{i}", capfd, "--init-drafter", str(d), check=False)
        assert rc == 2 and "Traceback" not in se, se
        errors = [x for x in se.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: --init-drafter:") and said in errors[0], se


PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"


def test_init_drafter_warm_starts_from_a_peers_export(tiny_assets, tmp_path, capfd):
    """Real SpecForge and speculators exports (tests/data/peers/, built for the tiny target): the run starts
    from their weights (bf16, cast to the fp32 training dtype) and trains; speculators' DFlash 2 with
    ``--arch dflash2`` and its selector sizes."""
    runs = {
        "specforge-0.2.0-dflash": [],
        "speculators-0.9.0-dflash": [],
        "speculators-0.9.0-dflash2": ["--arch", "dflash2", "--selector-rank", "8", "--selector-top-k", "4"],
    }
    for name, flags in runs.items():
        src, out = PEERS / name, tmp_path / name
        _, so, se = _run(
            tiny_assets, out, capfd, "--max-steps", "1", "--init-drafter", str(src), "--lr", "1e-30", *flags
        )
        assert (
            f"drafter weights from {src} ({'zlab' if 'specforge' in name else 'speculators'} layout"
            in so + se
        )
        want = load_file(src / "model.safetensors")
        got = load_file(checkpoint.latest(str(out / "checkpoints")) + "/drafter/model.safetensors")
        assert sorted(want) == sorted(got)
        # lr 1e-30 moves a weight by < 1e-29 (DFlash 2's identity-initialised zeros move by that much)
        assert all((want[k].float() - got[k]).abs().max() < 1e-20 for k in want), name
        assert [r["step"] for r in _steps(out)] == [1]
    # a drafter the flags do not describe: exit 2 naming the field, as for our own exports
    rc, _, se = _run(
        tiny_assets,
        tmp_path / "x",
        capfd,
        "--init-drafter",
        str(PEERS / "speculators-0.9.0-dflash2"),
        check=False,
    )
    assert rc == 2 and "--init-drafter" in se and "arch" in se
