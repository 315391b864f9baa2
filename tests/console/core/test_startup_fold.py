"""The start-up fold (console/core/startup_fold.py): phase, bytes, the estimate of the time to the first step from
the bytes rate and from the previous start, and the launch/restart printer on a terminal and on a pipe."""

from __future__ import annotations

import io

from console.core.events import Record
from console.core.startup_fold import StartupFold, StartupPrinter, fraction, line
from console.core.state import ConsoleState

GB = 2**30  # fmt_bytes counts in binary units


def restart_records() -> list[dict]:
    """A second start of a run whose first start took 60 s to its first step."""
    return [
        {"t": 100.0, "kind": "event", "name": "started", "pid": 7, "step": 40, "expected_first_step_s": 60.0},
        {
            "t": 100.3,
            "kind": "startup",
            "phase": "compile_cache",
            "elapsed_s": 1.3,
            "state": "warm",
            "reason": "same",
        },
        {"t": 104.0, "kind": "startup", "phase": "building_drafter", "elapsed_s": 5.0, "device": "cuda:1"},
        {
            "t": 105.0,
            "kind": "startup",
            "phase": "loading_target",
            "elapsed_s": 6.0,
            "bytes": 0,
            "total_bytes": 16 * GB,
        },
        {
            "t": 107.0,
            "kind": "startup",
            "phase": "loading_target",
            "elapsed_s": 8.0,
            "bytes": 4 * GB,
            "total_bytes": 16 * GB,
        },
    ]


def test_the_estimate_is_the_later_of_the_bytes_rate_and_the_last_start():
    f = StartupFold()
    for r in restart_records():
        assert f.apply(r)
    v = f.view(107.0)
    assert v.active and v.phase == "loading_target" and v.cache == "warm"
    assert v.rate == 2 * GB and v.bytes == 4 * GB and v.total_bytes == 16 * GB
    assert v.elapsed_s == 7.0 and v.eta_s == 53.0  # 60 s last time, 7 s gone; the bytes need only 6 s more
    text = line(v)
    assert text.startswith("loading the target 4.0 GB of 16.0 GB (2.0 GB/s)"), text
    assert "first step in ~53s" in text and "(last start 1m00s)" in text and "cache warm" in text
    assert fraction(v) == 7 / 60

    # a disk slower than the last start: the bytes left decide
    f.apply(
        {
            "t": 147.0,
            "kind": "startup",
            "phase": "loading_target",
            "elapsed_s": 48.0,
            "bytes": 8 * GB,
            "total_bytes": 16 * GB,
        }
    )
    v = f.view(147.0)
    assert v.rate == 8 * GB / 42 and v.eta_s == 42.0  # 8 GB in 42 s; 8 GB to go, more than 60 - 47 s

    f.apply(
        {
            "t": 230.0,
            "kind": "startup",
            "phase": "compiling",
            "elapsed_s": 131.0,
            "part": "drafter layer step",
        }
    )
    assert line(f.view(230.0)).startswith("compiling drafter layer step · 2m10s"), line(f.view(230.0))
    f.apply(
        {
            "t": 240.0,
            "kind": "startup",
            "phase": "first_step",
            "elapsed_s": 141.0,
            "seconds": 141.0,
            "step": 41,
        }
    )
    v = f.view(300.0)
    assert not v.active and v.first_step_s == 141.0 and v.eta_s is None
    assert line(v) == "first step 2m21s after launch (last start 1m00s), compile cache warm"


def test_a_tail_that_began_after_started_counts_from_elapsed_s_and_other_records_are_not_start_up():
    f = StartupFold()
    assert not f.apply({"t": 1.0, "kind": "step", "step": 3})
    assert not f.apply({"t": 1.0, "kind": "event", "name": "checkpoint_saved"})
    assert f.view(5.0) is None  # nothing of a start-up seen
    assert f.apply({"t": 110.0, "kind": "startup", "phase": "queue_filling", "elapsed_s": 10.0})
    v = f.view(112.0)
    assert v.active and v.elapsed_s == 12.0 and v.eta_s is None and v.phase == "queue_filling"
    f.apply({"t": 113.0, "kind": "event", "name": "stopped", "reason": "error"})
    assert not f.view(114.0).active and line(f.view(114.0)) == "start-up ended before the first step"


def test_the_screen_state_folds_it_and_lists_only_a_stale_cache_and_the_first_step():
    st = ConsoleState(clock=lambda: 107.0)
    recs = restart_records()
    recs[1] = {**recs[1], "state": "stale", "reason": "changed: trainer code: trainer/model.py"}
    for r in recs:
        st.apply(Record(r))
    assert st.startup_view().phase == "loading_target"
    texts = [e.text for e in st.events]
    assert texts == [
        "trainer started (PID 7, step 40)",
        "compile cache not reused: changed: trainer code: trainer/model.py",
    ]
    st.apply(Record({"t": 108.0, "kind": "startup", "phase": "first_step", "elapsed_s": 9.0, "seconds": 9.0}))
    assert st.events[-1].text == "first step 9.0 s after launch" and not st.startup_view().active


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_printer_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    now = [107.0]
    first = {"t": 160.0, "kind": "startup", "phase": "first_step", "elapsed_s": 60.0, "seconds": 60.0}
    pipe, tty = io.StringIO(), Tty()
    for out in (pipe, tty):
        p = StartupPrinter(out, lambda: now[0])
        for r in restart_records():
            p.on_record(r)
        p.on_record(first)
    plain = pipe.getvalue().splitlines()
    assert [ln.split(" · ")[0] for ln in plain] == [
        "start-up: starting",
        "start-up: starting (compile cache warm)",
        "start-up: building the drafter",
        "start-up: loading the target 0 B of 16.0 GB",
        "start-up: first step 1m00s after launch (last start 1m00s), compile cache warm",
    ]  # one line a phase: the second loading record (same phase, under 10 s later) is not repeated
    drawn = tty.getvalue()
    assert drawn.count("\r\x1b[2K") == 6 and drawn.endswith("\n") and drawn.count("\n") == 1
    assert "[##" in drawn and "% loading the target 4.0 GB of 16.0 GB" in drawn
