"""A NaN loss skips the step; five in a row save the last good state and stop with exit 3."""

from __future__ import annotations

import pytest

from tests.support.trainer_run import events, run, steps, tiny_flags

pytestmark = pytest.mark.e2e


def test_nan_steps_are_skipped_then_the_run_stops(tiny_assets, tmp_path):
    out = tmp_path / "r"
    rc, log = run(tiny_flags(tiny_assets, out, "--max-steps", "20"), DFLASH_TEST_NAN_STEPS="2,4,5,6,7,8")
    assert rc == 3, log
    ev = events(out)
    assert [e["step"] for e in ev if e["name"] == "nan_skipped"] == [2, 4, 5, 6, 7, 8]
    assert [s["step"] for s in steps(out)] == [1, 3]  # skipped steps have no step record
    names = [e["name"] for e in ev]
    assert names[-3:] == ["checkpoint_saving", "checkpoint_saved", "stopped"]
    assert ev[-1]["reason"] == "nan" and ev[-1]["exit_code"] == 3
    saved = ev[-2]
    assert saved["step"] == 8
    # the saved weights are the last good ones (after step 3): finite, and loadable
    import torch

    from trainer.model import load_drafter

    drafter, _ = load_drafter(saved["path"] + "/drafter")
    assert all(torch.isfinite(p).all() for p in drafter.parameters())
