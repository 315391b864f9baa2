"""A checkpoint is verified before anything is loaded from it, and loaded without running its code
(issue 33, items 2 and 7): the real tiny trainer's checkpoints, damaged or replaced as an attacker or a
failing disk would.

- a ``state.pt`` whose pickle would run ``touch MARKER`` (its manifest rewritten to match, so that only the
  loader stands in the way): ``--resume auto`` refuses it, naming the file, and the marker is never made;
- a truncated ``state.pt`` in the only checkpoint: ``--resume auto`` refuses to start fresh over it (exit 2,
  the file named) and leaves it as it was; ``--resume none`` starts fresh and keeps it;
- a damaged newest checkpoint (same sizes, other bytes): the resume falls back to the one before, says so,
  sets the damaged one aside as ``step_N.bad`` and the new save of that step does not replace it;
- a checkpoint in the older format (numpy's RNG state as an array, no checksums) still resumes.

The trainer runs in this process (tests/support/trainer_run.py ``run_in_process``).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from tests.support.trainer_run import events, run_in_process, tiny_flags
from trainer.run import checkpoint

S2, S4 = checkpoint.step_dir_name(2), checkpoint.step_dir_name(4)


@pytest.fixture(scope="module")
def base_run(tiny_assets, tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4 (copied by each test)."""
    out = tmp_path_factory.mktemp("trust") / "run"
    assert run_in_process(tiny_flags(tiny_assets, out, "--max-steps", "4", "--save-every", "2")) == 0
    assert checkpoint.list_steps(str(out / "checkpoints")) == [S2, S4]
    return out


def _copy(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out, out / "checkpoints"


def _rewrite_manifest(ckpt, drop_sums: bool = False) -> None:
    """What an attacker who can write the run directory does: the manifest made to match the files."""
    man = json.loads((ckpt / "manifest.json").read_text())
    man["files"] = {rel: (ckpt / rel).stat().st_size for rel in man["files"]}
    man["sha256"] = checkpoint.checksums(str(ckpt), list(man["files"]))
    if drop_sums:
        del man["sha256"]
    (ckpt / "manifest.json").write_text(json.dumps(man))


class Evil:
    """Unpickled, it runs ``touch MARKER`` (its pickle names ``posix.system``)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def _run(flags, capfd) -> tuple[int, str]:
    capfd.readouterr()
    rc = run_in_process(flags)
    return rc, "".join(capfd.readouterr())


def test_a_malicious_state_pt_is_refused_and_runs_nothing(tiny_assets, base_run, tmp_path, capfd):
    out, root = _copy(base_run, tmp_path)
    shutil.rmtree(root / S2)  # the only checkpoint: nothing to fall back to
    marker, state = tmp_path / "MARKER", root / S4 / "state.pt"
    torch.save({"step": 4, "cursor": 4, "optimizer": Evil(marker), "rng": {}}, state)
    _rewrite_manifest(root / S4)
    assert checkpoint.verify(str(root / S4)) is None  # sizes and checksums agree: only the loader decides
    rc, output = _run(tiny_flags(tiny_assets, out, "--max-steps", "6", "--resume", "auto"), capfd)
    assert not marker.exists(), output
    assert rc == 2, output
    assert f"{state}: refused by the safe loader" in output and "posix.system" in output, output
    assert (root / S4).is_dir() and not (root / f"{S4}.bad").exists()  # refused: nothing changed


def test_a_truncated_only_checkpoint_is_never_a_silent_fresh_start(tiny_assets, base_run, tmp_path, capfd):
    out, root = _copy(base_run, tmp_path)
    shutil.rmtree(root / S4)
    (root / "latest").write_text(S2 + "\n")
    state = root / S2 / "state.pt"
    with open(state, "r+b") as f:
        f.truncate(1000)
    before = {p.name: p.read_bytes() for p in (root / S2).rglob("*") if p.is_file()}
    rc, output = _run(tiny_flags(tiny_assets, out, "--max-steps", "2", "--resume", "auto"), capfd)
    assert rc == 2, output
    assert "no checkpoint in" in output and f"{state}: 1000 bytes, the manifest says" in output, output
    assert "fresh start" not in output
    assert {p.name: p.read_bytes() for p in (root / S2).rglob("*") if p.is_file()} == before
    # --resume none: a fresh start beside it; its step-2 save does not replace the damaged folder
    rc, output = _run(tiny_flags(tiny_assets, out, "--max-steps", "2", "--resume", "none"), capfd)
    assert rc == 0, output
    assert (root / f"{S2}.bad" / "state.pt").stat().st_size == 1000
    assert checkpoint.verify(str(root / S2)) is None


def test_a_damaged_newest_checkpoint_falls_back_and_is_kept(tiny_assets, base_run, tmp_path, capfd):
    out, root = _copy(base_run, tmp_path)
    weights = root / S4 / "drafter" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # same size, other bytes: only the checksum tells
    weights.write_bytes(bytes(data))
    rc, output = _run(tiny_flags(tiny_assets, out, "--max-steps", "4", "--resume", "auto"), capfd)
    assert rc == 0, output
    assert f"{weights}: its SHA-256 differs from the manifest's" in output, output
    assert f"set aside as {root / S4}.bad" in output
    assert f"resuming from {root / S2}, the newest checkpoint that verifies" in output
    assert (root / f"{S4}.bad" / "drafter" / "model.safetensors").read_bytes() == bytes(data)
    assert checkpoint.verify(str(root / S4)) is None  # the new save of step 4, beside the bad one
    started = [e for e in events(out) if e["name"] == "started"]
    assert started[-1]["step"] == 2


def test_an_old_format_checkpoint_still_resumes(tiny_assets, base_run, tmp_path, capfd):
    """Trainer 0.1.0's state.pt (numpy's RNG state as ``np.random.get_state()``, an array) and manifest
    (sizes, no checksums): the safe loader reads it with numpy's array globals allowed, nothing else."""
    out, root = _copy(base_run, tmp_path)
    state = root / S4 / "state.pt"
    s = torch.load(state, weights_only=True)
    s["rng"]["numpy"] = np.random.RandomState(
        7
    ).get_state()  # what np.random.seed(7); np.random.get_state() gave
    torch.save(s, state)
    _rewrite_manifest(root / S4, drop_sums=True)
    rc, output = _run(tiny_flags(tiny_assets, out, "--max-steps", "6", "--resume", "auto"), capfd)
    assert rc == 0, output
    assert f"resumed from {root / S4}: step 4" in output, output
    assert os.path.isdir(root / checkpoint.step_dir_name(6))
