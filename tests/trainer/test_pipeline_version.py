"""``python -m trainer.pipeline --version`` prints the trainer's version and exits 0, touching nothing."""

import subprocess
import sys

import pytest

from tests.support.trainer_run import env
from trainer import __version__

pytestmark = pytest.mark.e2e  # each test starts a real process


def test_version_prints_the_trainer_version_and_exits_0(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trainer.pipeline", "--version"],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"trainer {__version__}\n"
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing written
