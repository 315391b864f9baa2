"""console/core/threads.py and console/core/pyspy.py, headless: CPU% from tick deltas, a reused thread id,
the caps said, rows in order, replies that are not replies, py-spy's outcomes. The caps are the helper's
own (its ``threads`` op called in-process on a stand-in run of real processes)."""

from __future__ import annotations

import json

import pytest

from console.core import pyspy
from console.core.helper_program.run_threads import op_threads
from console.core.threads import (
    Sampler,
    ThreadsError,
    format_text,
    one_line,
    role_of,
    rows,
    to_json,
)
from tests.support.threads_standin import threads_standin

TCK = 100


def reply(t: float, procs: list[dict], **extra) -> dict:
    return {
        "gone": False,
        "t": t,
        "clk_tck": TCK,
        "ncpu": 4,
        "root": procs[0]["pid"],
        "procs": procs,
        **extra,
    }


def proc(
    pid: int, ticks: int, threads: list[list], comm="python3", cmdline="python3 -m trainer.pipeline", **kw
):
    return {
        "pid": pid,
        "ppid": 1,
        "comm": comm,
        "state": "S",
        "ticks": ticks,
        "start_time": 1000 + pid,
        "cmdline": cmdline,
        "threads": threads,
        "threads_total": len(threads),
        **kw,
    }


def test_cpu_percent_is_ticks_over_time_and_a_reused_tid_makes_no_rate():
    s = Sampler()
    first = s.feed(
        reply(10.0, [proc(7, 100, [[7, "dflash-launch", "S", 40, 0, 5], [8, "python3", "R", 60, 1, 6]])])
    )
    assert first.interval_s is None and first.procs[0].cpu_pct is None
    # 2 s later: the main thread used 50 ticks (0.5 s: 25%), tid 8 is a new thread (another start time)
    snap = s.feed(
        reply(12.0, [proc(7, 250, [[7, "dflash-launch", "R", 90, 2, 5], [8, "python3", "R", 3, 1, 99]])])
    )
    main, reused = snap.procs[0].threads
    assert snap.interval_s == pytest.approx(2.0)
    assert main.cpu_pct == pytest.approx(25.0) and main.named and main.main
    assert reused.cpu_pct is None and not reused.named  # same tid, another thread: no delta
    assert snap.procs[0].cpu_pct == pytest.approx(75.0)  # 150 ticks over 2 s


def test_rows_put_the_busiest_process_and_thread_first():
    s = Sampler()
    launcher = proc(10, 0, [[10, "dflash-launch", "S", 0, 0, 1]])
    worker = proc(11, 0, [[11, "dflash-drafter0", "S", 0, 0, 2], [12, "dflash-meter", "S", 0, 0, 3]])
    worker["cmdline"] = "python -m trainer.worker --settings {}"
    worker["comm"] = "dflash-drafter0"
    s.feed(reply(0.0, [launcher, worker]))
    launcher = {**launcher, "ticks": 5, "threads": [[10, "dflash-launch", "S", 5, 0, 1]]}
    worker = {
        **worker,
        "ticks": 90,
        "threads": [[11, "dflash-drafter0", "R", 10, 0, 2], [12, "dflash-meter", "R", 80, 1, 3]],
    }
    snap = s.feed(reply(1.0, [launcher, worker]))
    assert [r.key for r in rows(snap)] == ["p11", "t11:12", "t11:11", "p10", "t10:10"]
    assert snap.find(10).role == "launcher" and snap.find(11).role == "drafter0"
    text = format_text(snap)
    assert text.splitlines()[0].startswith("trainer pid 10: 2 process(es), 3 threads; CPU% over 1.0 s")
    assert "90.0%" in text and "80.0%" in text
    js = to_json(snap)
    assert js["processes"][1]["threads"][1] == {
        "tid": 12, "name": "dflash-meter", "named": True, "main": False, "state": "R",
        "cpu_pct": pytest.approx(80.0), "cpu_s": 0.8, "last_cpu": 1,
    }  # fmt: skip
    json.dumps(js)  # serialisable as it is


def test_a_limit_keeps_the_busiest_threads_and_sums_the_rest_in_one_row():
    s = Sampler()
    many = [[100 + i, f"w{i}", "S", 0, 0, i] for i in range(12)]
    s.feed(reply(0.0, [proc(100, 0, many)]))
    later = [[100 + i, f"w{i}", "S", i, 0, i] for i in range(12)]  # thread i used i ticks
    snap = s.feed(reply(1.0, [proc(100, 66, later)]))
    shown = rows(snap, limit=3)
    assert [r.name for r in shown[1:4]] == ["w11", "w10", "w9"]
    more = shown[4]
    assert len(shown) == 5 and more.key == "m100" and more.more == 9
    assert more.cpu_pct == pytest.approx(sum(range(9)))  # the other nine threads' CPU% together
    assert len(rows(snap)) == 13 and len(rows(snap, limit=11)) == 13  # no row for a single thread left out


def test_roles():
    assert role_of(5, 5, "dflash-launch", "python -m trainer.pipeline", True) == "launcher"
    assert role_of(5, 5, "python3", "python -m trainer.pipeline", False) == "trainer"
    assert role_of(6, 5, "dflash-target1", "", True) == "target1"
    assert role_of(6, 5, "python3", "python -m trainer.worker --settings x", True) == "worker"
    assert role_of(6, 5, "sh", "sh -c nvidia-smi", True) is None


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"gone": False, "t": "x", "clk_tck": 100, "root": 1, "procs": []},
        {"gone": False, "t": 1.0, "clk_tck": 0, "root": 1, "procs": []},
        reply(1.0, [proc(1, 0, [[1, "a", "S", "many", 0, 0]])]),
        reply(1.0, [proc(1, 0, [[1, "a", "S", 0, 0]])]),
        reply(1.0, [{**proc(1, 0, []), "pid": True}]),
        reply(1.0, [{**proc(1, 0, []), "comm": 5}]),
    ],
)
def test_a_reply_that_is_not_one_is_said_and_nothing_is_kept(bad):
    s = Sampler()
    s.feed(reply(0.0, [proc(1, 0, [[1, "a", "S", 0, 0, 0]])]))
    with pytest.raises(ThreadsError, match="not one"):
        s.feed(bad)
    after = s.feed(reply(1.0, [proc(1, 50, [[1, "a", "S", 50, 0, 0]])]))
    assert after.procs[0].cpu_pct == pytest.approx(50.0)  # the good sample before still counts


def test_names_are_kept_to_one_line():
    assert one_line("a\nb\tc\rd") == "a\ufffdb\ufffdc\ufffdd"
    snap = Sampler().feed(reply(0.0, [proc(1, 0, [[1, "x\ny", "S", 0, 0, 0]])]))
    assert snap.procs[0].threads[0].name == "x\ufffdy"


@pytest.mark.e2e  # the stand-in trainer and its child are real processes
def test_the_helper_caps_processes_and_threads_and_says_so(tmp_path):
    """The ``threads`` op in-process on a real run (the stand-in and its child): capped at one process
    and two threads, it says how many there were, and the snapshot's notes say it plainly."""
    run_dir = tmp_path / "run"
    with threads_standin(tmp_path, run_dir) as (_, child):
        info = json.loads((run_dir / "run.json").read_text())
        req = {"pid": info["pid"], "start_time": info["start_time"], "run_dir": str(run_dir)}
        r = op_threads({**req, "max_procs": 1, "max_threads": 2})
        assert r["procs_total"] == 2 and [q["pid"] for q in r["procs"]] == [info["pid"]]
        assert len(r["procs"][0]["threads"]) == 2 and r["procs"][0]["threads_total"] == 3
        notes = Sampler().feed(r).notes()
        assert notes == [
            "1 of 2 processes shown (capped)",
            f"pid {info['pid']} (trainer): 2 of 3 threads shown (capped)",
        ]
        full = op_threads(req)
        assert [q["pid"] for q in full["procs"]] == [info["pid"], child] and Sampler().feed(
            full
        ).notes() == []


def test_pyspy_outcomes_are_said():
    assert pyspy.result(5, {"ran": False, "found": False, "looked": ["/usr/bin/py-spy"]}).text.startswith(
        "py-spy is not in the container: looked at the helper's PATH (/usr/bin/py-spy)"
    )
    assert pyspy.result(5, {"ran": False, "why": "pid 5 is not a process of this run (now)"}).text == (
        "not run: pid 5 is not a process of this run (now)"
    )
    failed = pyspy.result(
        5, {"ran": True, "path": "/v/py-spy", "rc": 1, "stdout": "", "stderr": "Permission denied"}
    )
    assert not failed.ok and failed.text == "/v/py-spy dump --pid 5 failed (exit 1): Permission denied"
    slow = pyspy.result(5, {"ran": True, "path": "/v/py-spy", "rc": None, "timed_out": True, "stderr": ""})
    assert not slow.ok and "did not finish in time" in slow.text
    many = "\n".join(f"line {i}" for i in range(pyspy.MAX_LINES + 5))
    ok = pyspy.result(5, {"ran": True, "path": "/v/py-spy", "rc": 0, "stdout": many, "stderr": ""})
    assert ok.ok and ok.text.endswith("… 5 more lines not shown")
    assert not pyspy.result(5, "nonsense").ok
