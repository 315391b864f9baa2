"""The place's scheduler job (a Slurm job): squeue's lines read (bounded, hostile lines skipped), the time
left counted down on the local clock, the time-limit alert, the connection bar, and record/replay."""

from __future__ import annotations

import pytest

from console.core.events import JobState
from console.core.health import CRITICAL, WARNING, Health, HealthConfig
from console.core.place import Proxmox, Slurm
from console.core.places.slurm import duration_s, parse_jobs, pick_job, queue_position
from console.core.record import decode, encode
from console.core.state import ConsoleState
from console.core.status import job_text, ordinal
from console.widgets.connection_bar import bar_text, job_part
from tests.console.core.test_health import Clock

SQUEUE = (
    "13|PENDING|Priority|0:00|2:00:00|2:00:00||gpu|/r/train.log\n"
    "12|RUNNING|None|1:02:03|57:57|2:00:00|gpu[01-02]|gpu|/runs/a|b/train.log\n"
)


def test_squeue_lines_are_read_and_a_name_means_its_running_job_first():
    jobs = parse_jobs(SQUEUE)
    assert [j["job"] for j in jobs] == ["13", "12"]
    assert pick_job(jobs) == {
        "job": "12",
        "state": "RUNNING",
        "reason": "",
        "used_s": 3723,
        "left_s": 3477,
        "limit_s": 7200,
        "nodes": "gpu[01-02]",
        "partition": "gpu",
        "stdout": "/runs/a|b/train.log",
    }
    assert Slurm("dflash").run_dir(pick_job(jobs)) == "/runs/a|b"  # the job names its run
    assert (
        Slurm("dflash").run_dir({"stdout": "/home/u/slurm-12.out"}) is None
        and Slurm("x").run_dir(None) is None
    )
    assert Slurm("dflash").state(SQUEUE)["job"] == "12" and Slurm("dflash").state("") is None
    assert Slurm("dflash").state_argv()[3:6] == ["squeue", "-n", "dflash"]  # sh -c SCRIPT squeue ...
    assert Slurm("12").state_argv()[3:6] == ["squeue", "-j", "12"]
    assert Proxmox(200).state_argv() is None  # no scheduler: nothing polled


def test_a_pending_job_knows_its_place_in_its_partitions_queue():
    queue = "#queue\n20|gpu\n13|gpu\n14|cpu\n15|gpu\n"  # priority order (squeue --sort=-p,i)
    st = Slurm("dflash").state(SQUEUE.splitlines()[0] + "\n" + queue)
    assert (st["job"], st["position"], st["queued"]) == ("13", 2, 3)
    assert "2nd of 3 pending in gpu" in job_text(st)
    state = ConsoleState(clock=Clock())
    state.apply(JobState.of(st, 0.0))
    assert job_part(state) == ("job 13 PENDING (Priority) 2/3 in queue", "yellow")
    assert queue_position("#queue\n1|gpu\n", "13", "gpu") == {}  # not shown: nothing made up
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"
    ]  # fmt: skip


def test_hostile_or_odd_squeue_output_is_skipped_and_bounded():
    odd = (
        "x|RUNNING|a|b|c|d|e\n12|RUNNING\n\x1b]0;t\x07|x\n" + "9|RUNNING|r|1:00|UNLIMITED|UNLIMITED|n\n" * 500
    )
    jobs = parse_jobs(odd)
    assert len(jobs) <= 64 and all(j["job"] == "9" and j["left_s"] is None for j in jobs)
    assert [duration_s(t) for t in ("1-00:00:01", "5:07", "7", "INVALID", "1:2:3:4", "-5", "")] == [
        86401,
        307,
        7,
        None,
        None,
        None,
        None,
    ]


def running_job(t: float, left_s: int) -> JobState:
    return JobState("12", "RUNNING", "", 60, left_s, 7200, "node1", None, t)


def test_the_time_limit_alert_counts_down_on_the_local_clock():
    clock = Clock()
    h = Health(HealthConfig(job_left_s=1800), clock=clock)
    h.apply(running_job(clock.t, 1900))
    h.evaluate()
    assert not h.alerts()
    clock.t += 200  # no new poll: 1700 s left now
    h.evaluate()
    assert [(a.rule, a.level) for a in h.alerts()] == [("job_time_left", WARNING)]
    assert "job 12 has 28m20s left" in h.alerts()[0].message
    clock.t += 1500
    h.evaluate()
    assert h.alerts()[0].level == CRITICAL
    h.apply(JobState("12", "COMPLETING", "", 7200, 0, 7200, "node1", None, clock.t))
    h.evaluate()
    assert not h.alerts()  # the job is ending: nothing to warn of


def test_the_bar_names_the_job_and_its_time_left():
    clock = Clock()
    state = ConsoleState(clock=clock)
    state.apply(running_job(clock.t, 3600))
    clock.t += 65
    assert job_part(state) == ("job 12 RUNNING on node1 58m55s left", "bold")
    assert "job 12 RUNNING on node1 58m55s left" in bar_text(state, "h1 · job dflash", False).plain
    state.apply(JobState("13", "PENDING", "Priority", 0, 7200, 7200, "", None, clock.t))
    assert job_part(state) == ("job 13 PENDING (Priority)", "yellow")
    state.apply(JobState(t=clock.t))
    assert job_part(state) == ("no job", "yellow")
    assert job_part(ConsoleState(clock=clock)) is None  # not a scheduler's place


def test_a_job_state_is_recorded_and_replayed_field_by_field():
    ev = running_job(5.0, 100)
    name, data = encode(ev)
    assert decode(name, data) == ev
    with pytest.raises(TypeError, match="left_s"):
        decode(name, {**data, "left_s": "soon"})
