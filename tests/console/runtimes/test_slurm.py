"""Real Slurm (one node, this machine): ``--slurm NAME`` launches the trainer as a batch job (``sbatch``,
the trainer exec'd as the batch script), reaches it with ``srun --jobid=J --overlap`` for everything else,
and the whole walk works there (tests/support/runtime_walk.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.core_util import alive, cli, conn_args, options_for, wait_until
from tests.support.runtime_walk import missing_program, runtime_fixtures, walk, wrong_name
from tests.support.runtimes.common import until
from tests.support.runtimes.slurm import Slurm
from tests.support.trainer_run import events, records, steps, tiny_flags

pytestmark = pytest.mark.e2e
runtime, host = runtime_fixtures(Slurm)


def test_launch_as_a_job_restart_onto_deployed_code_and_stop_cleanly(host, runtime, tiny_assets, tmp_path):
    jobs = []

    def in_a_job(run: dict) -> None:  # the trainer is the batch script of a running job of that name
        environ = Path(f"/proc/{run['pid']}/environ").read_text()
        env = dict(kv.split("=", 1) for kv in environ.split("\0") if "=" in kv)
        job = env["SLURM_JOB_ID"]
        assert runtime.cli("squeue", "-h", "-j", job, "-o", "%j %T").stdout.split() == ["dflash-a", "RUNNING"]
        assert job not in jobs and "SLURM_STEP_ID" not in env  # a new job a start; the batch step itself
        jobs.append(job)

    says = "submitted as: sbatch --parsable --job-name=dflash-a ... (a new Slurm job dflash-a)"
    walk(
        host,
        ["--slurm", "dflash-a"],
        "slurm",
        tmp_path / "run",
        tiny_assets,
        alive,
        launched=in_a_job,
        restart_says=says,
    )
    assert len(jobs) == 2
    assert (
        runtime.cli("squeue", "-h", "-n", "dflash-a").stdout.strip() == ""
    )  # the job ended with its trainer


def test_a_job_named_by_id_that_is_not_there_is_one_line(host):
    wrong_name(host, "--slurm", "999999", "999999")


def test_a_launch_into_a_running_job_by_id_is_refused_before_anything_runs(
    host, runtime, tiny_assets, tmp_path
):
    job = runtime.submit("other", "exec sleep 300", cwd=tmp_path)
    try:
        until(lambda: runtime.state(job) == "RUNNING", 60, "the job to run")
        r = cli(
            "launch",
            *conn_args(host, ct=None),
            "--slurm",
            job,
            "--",
            *tiny_flags(tiny_assets, tmp_path / "r"),
        )
        assert r.returncode == 2 and "name it (--slurm NAME)" in r.stderr, r.stderr
        assert not (tmp_path / "r").exists()
    finally:
        runtime.cli("scancel", job)


def test_srun_missing_on_the_host_is_one_line(tmp_path):
    missing_program(tmp_path, "--slurm", "12", "srun")


def test_a_pending_job_is_shown_as_waiting_with_its_reason_and_place_in_the_queue(host, runtime, tmp_path):
    ahead = runtime.submit("ahead", "exec sleep 300", "--begin=now+1hour", cwd=tmp_path)
    job = runtime.submit("later", "exec sleep 300", "--begin=now+1hour", cwd=tmp_path)
    try:
        r = cli("status", *conn_args(host, ct=None), "--slurm", "later")
        assert r.returncode == 4, r.stdout + r.stderr  # no trainer (yet)
        assert f"job {job} PENDING (BeginTime), 2nd of 2 pending in debug" in r.stdout
        assert f"trainer: waiting for Slurm job {job} to start (BeginTime)" in r.stdout
        st = json.loads(cli("status", *conn_args(host, ct=None), "--slurm", "later", "--json").stdout)
        assert st["job"]["job"] == job and st["job"]["state"] == "PENDING" and st["trainer"] is None
        assert (st["job"]["position"], st["job"]["queued"]) == (2, 2)
    finally:
        runtime.cli("scancel", job, ahead)


def test_a_job_that_reaches_its_time_limit_ends_in_a_checkpoint(host, runtime, tiny_assets, tmp_path):
    run_dir = tmp_path / "run"
    flags = tiny_flags(tiny_assets, run_dir, "--epochs", "1000")
    args = [*conn_args(host, ct=None), "--slurm", "short"]
    # a one-minute job: --signal=B:INT@120 is due at once (Slurm sends it within its ~30-60 s check)
    r = cli(
        "launch", *args, "--python", sys.executable, "--env", "SBATCH_TIMELIMIT=1", "--detach", "--", *flags
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted Slurm job (\d+)", r.stdout)
    assert job, r.stdout
    st = cli("status", *args)  # the job, or (its SIGINT due at once) already ended: never another trainer
    assert st.returncode in (0, 4) and (
        f"job {job.group(1)} RUNNING" in st.stdout or "none running" in st.stdout
    )
    gone = lambda: runtime.state(job.group(1)) == ""  # noqa: E731
    wait_until(gone, 150, "the job to end")
    names = [e["name"] for e in events(run_dir)]
    assert "checkpoint_saved" in names and names[-1] == "stopped", names
    stopped = [e for e in events(run_dir) if e["name"] == "stopped"][-1]
    assert (stopped["reason"], stopped["exit_code"]) == ("signal", 0)  # the SIGINT, not the time limit's kill


async def test_the_screen_shows_the_job_and_alerts_before_its_time_limit(host, runtime, tmp_path):
    from console.app import ConsoleApp
    from console.core.place import Slurm as SlurmPlace
    from console.core.session import Session
    from tests.support.screen_text import screen_text, until

    job = runtime.submit(
        "shown", "exec sleep 600", "--time=10", cwd=tmp_path
    )  # 10 min: under the 30 min warning
    try:
        wait_until(lambda: runtime.state(job) == "RUNNING", 60, "the job to run")
        app = ConsoleApp(Session(options_for(host), place=SlurmPlace("shown")), target="devhost · job shown")
        async with app.run_test(size=(130, 40)) as pilot:
            shown = lambda: re.search(rf"job {job} RUNNING on node1 \dm\d\ds left", screen_text(app))  # noqa: E731
            await until(pilot, shown, 60, "the job's state and time left in the bar")
            alerts = lambda: any(a.rule == "job_time_left" for a in app.state.health.alerts())  # noqa: E731
            await until(pilot, alerts, 30, "the time-limit alert")
            assert f"job {job} has " in app.state.health.alerts()[0].message
    finally:
        runtime.cli("scancel", job)


def _job_processes(job: str) -> list[dict]:
    """This job's processes on the machine (both nodes are this machine): pid, node, step, command line."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            environ = proc.joinpath("environ").read_bytes().split(b"\0")
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        env = dict(kv.decode(errors="replace").split("=", 1) for kv in environ if b"=" in kv)
        if env.get("SLURM_JOB_ID") == job:
            cmd = [a.decode(errors="replace") for a in argv if a]
            out.append({"pid": int(proc.name), "node": env.get("SLURMD_NODENAME"), "cmd": cmd})
    return out


def test_a_run_of_two_nodes_trains_as_one_job_and_stops_cleanly(host, runtime, tiny_assets, tmp_path):
    """``--launch torchrun --nnodes 2``: one job of two nodes, the launcher as the batch script on node 0,
    one torchrun per node (a target and a drafter each: the drafters are DDP replicas across the nodes),
    stopped with the same guarded SIGINT: every worker saves and exits, and the job ends."""
    run_dir = tmp_path / "run"
    flags = tiny_flags(tiny_assets, run_dir, "--epochs", "1000", "--launch", "torchrun", "--nnodes", "2")
    args = [*conn_args(host, ct=None), "--slurm", "pair"]
    r = cli("launch", *args, "--python", sys.executable, "--", *flags, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted Slurm job (\d+)", r.stdout).group(1)
    shape = runtime.cli("squeue", "-h", "-j", job, "-o", "%D %N %B").stdout.split()
    assert shape == ["2", "node[1-2]", "node1"], shape
    wait_until(lambda: steps(run_dir), 240, "a training step of the two-node run")
    run = json.loads((run_dir / "run.json").read_text())
    procs = _job_processes(job)
    workers = [p for p in procs if "trainer.worker" in p["cmd"] and "torch.distributed.run" not in p["cmd"]]
    assert sorted(p["node"] for p in workers) == ["node1", "node1", "node2", "node2"], procs
    launcher = next(p for p in procs if p["pid"] == run["pid"])  # the batch script, exec'd: node 0
    assert launcher["node"] == "node1" and "trainer.pipeline" in launcher["cmd"]
    full = lambda: [r for r in records(run_dir) if r["kind"] == "throughput" and len(r["devices"]) == 4]  # noqa: E731
    wait_until(full, 60, "a throughput record listing every worker")
    thr = full()[-1]
    assert sorted(d.get("host") for d in thr["devices"]) == ["node1", "node1", "node2", "node2"], thr

    st = json.loads(cli("status", *args, "--json").stdout)  # the job names its run: no --run-dir
    assert st["trainer"]["pid"] == run["pid"] and st["job"]["nodes"] == "node[1-2]", st

    r = cli("stop", *args, "--yes", "--timeout", "120", timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    saved = [e for e in events(run_dir) if e["name"] == "checkpoint_saved"][-1]
    assert f"step {saved['step']}" in r.stdout
    wait_until(lambda: runtime.state(job) == "", 60, "the job to end")
    assert not [p for p in _job_processes(job) if alive(p["pid"])]  # no worker left on either node
    stopped = [e for e in events(run_dir) if e["name"] == "stopped"][-1]
    assert (stopped["reason"], stopped["exit_code"]) == ("signal", 0), stopped  # the targets left as told
    log = (run_dir / "train.log").read_text()
    assert "Traceback" not in log and "srun: error" not in log, log[-3000:]  # torchrun's agents left cleanly
