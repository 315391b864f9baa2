"""The stop's verdict when the trainer's save failed on a full disk that refused even the events saying so: its
exit status 4 (docs/run-directory.md: the final checkpoint could not be written) is read as "checkpoint failed"."""

from __future__ import annotations

import asyncio

from console.core.events import Outcome, TrainerInfo
from console.core.stop import StopFollow


def test_exit_4_without_events_is_a_failed_checkpoint():
    follow = StopFollow(TrainerInfo(pid=4242, start_time=1, cmdline=[], run_dir=None, source="run.json"))
    follow.has_events = True  # a contract trainer whose full disk took checkpoint_saving, error and stopped
    res = asyncio.run(follow._conclude(None, {"rc": 4}))
    assert res.code == Outcome.NO_CHECKPOINT
    assert res.message.startswith(
        "checkpoint failed: the save did not complete; pid 4242 exited, exit code 4"
    )
