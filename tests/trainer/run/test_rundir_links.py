"""The trainer never writes through a link it did not make (docs/trust.md): a symlinked metrics.jsonl,
checkpoints/ or tracker folder in the run directory is refused at start (exit 2, one line naming it), and the
writers open their files with O_NOFOLLOW, so a link planted while the run goes on is refused too."""

from __future__ import annotations

import os

import pytest

from tests.support.trainer_run import run, tiny_flags
from trainer.run import checkpoint, rundir


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints", "tensorboard", "mlruns"])
def test_the_trainer_refuses_a_symlinked_run_directory_file(tiny_assets, tmp_path, name):
    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    if name == "metrics.jsonl":
        victim.write_text("precious\n")
    else:
        victim.mkdir()
    (out / name).symlink_to(victim)
    rc, output = run(
        tiny_flags(tiny_assets, out, "--max-steps", "2", "--report-to", "tensorboard"), timeout=180
    )
    assert rc == 2, output
    said = [x for x in output.splitlines() if x.startswith("error:")]
    assert len(said) == 1 and f"{out / name} is a symbolic link (to '{victim}'): refused" in said[0], output
    assert "Traceback" not in output
    if name == "metrics.jsonl":
        assert victim.read_text() == "precious\n"
    else:
        assert os.listdir(victim) == []  # nothing written through the link


def test_metrics_writer_never_appends_through_a_link_nor_to_a_fifo(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(rundir.LinkRefused, match="is a symbolic link"):
        rundir.MetricsWriter(str(tmp_path / "metrics.jsonl"))
    assert victim.read_text() == "precious\n"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(rundir.LinkRefused, match="not a regular file"):  # at once: the open does not wait
        rundir.MetricsWriter(str(tmp_path / "fifo"))


def test_a_checkpoints_link_planted_mid_run_fails_the_save_not_the_target(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "checkpoints").symlink_to(victim)

    def payload(d: str) -> None:
        with open(os.path.join(d, "state.pt"), "wb") as f:
            f.write(b"s")

    with pytest.raises(OSError, match="is a symbolic link"):  # the step loop takes it as a failed save
        checkpoint.save(str(tmp_path / "checkpoints"), 1, payload, {})
    assert os.listdir(victim) == []
