"""``dflash-console --version`` says the installed package's version (pyproject.toml's)."""

import re

import pytest

from tests.support.core_util import cli
from tests.support.trainer_run import ROOT

pytestmark = pytest.mark.e2e


def test_version():
    want = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    r = cli("--version", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"dflash-console {want}\n"
