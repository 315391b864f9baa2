"""``dflash-console threads`` as a real subprocess through the in-process SSH server, against a stand-in run
of real processes (tests/support/threads_standin.py): the table and ``--json`` (a hostile thread name
cleaned), ``--dump`` when py-spy is not in the container, a pid outside the run, no trainer, bad usage.
The real trainer (and a real py-spy dump on a read-only target): tests/console/screen/test_threads_live.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.core_util import CT, cli, conn_args
from tests.support.devhost import devhost_fixture
from tests.support.threads_standin import (
    HOSTILE_SHOWN,
    no_pyspy_env,
    python_without_pyspy,
    threads_standin,
)

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module", env=no_pyspy_env)


@pytest.fixture(scope="module")
def run(host, tmp_path_factory):
    run_dir = host.container_dir(CT) / "run"
    python = python_without_pyspy(tmp_path_factory.mktemp("py"))
    with threads_standin(host.container_dir(CT), run_dir, python=python) as (p, child):
        yield p, child, run_dir


def test_json_and_table_name_every_thread_cleaned(host, run):
    p, child, run_dir = run
    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--json", "--interval", "0.3")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\\u001b" not in r.stdout and "\\u009b" not in r.stdout
    st = json.loads(r.stdout)
    assert st["trainer_pid"] == p.pid and st["interval_s"] > 0.2
    procs = {q["pid"]: q for q in st["processes"]}
    assert set(procs) == {p.pid, child}
    assert procs[p.pid]["role"] == "trainer" and procs[child]["role"] == "target0"
    names = {t["name"] for t in procs[p.pid]["threads"]}
    assert names == {"dflash-launch", "dflash-spin", HOSTILE_SHOWN}
    assert all(t["cpu_pct"] is not None for q in st["processes"] for t in q["threads"])  # two samples

    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--interval", "0.2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"trainer pid {p.pid}: 2 process(es), 4 threads; CPU% over 0.")
    assert any(HOSTILE_SHOWN in ln for ln in lines) and "\x1b" not in r.stdout
    assert any(ln.split()[:3] == [str(child), "target0", "dflash-target0"] for ln in lines), lines


def test_dump_without_pyspy_and_outside_the_run(host, run):
    p, _child, run_dir = run
    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--dump", str(p.pid))
    assert r.returncode == 1 and r.stdout == ""
    assert "py-spy is not in the container: looked at the helper's PATH" in r.stderr, r.stderr
    pyspy = str(Path(sys.executable).parent / "py-spy")  # the test extra's, named by the operator
    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--dump", str(p.pid), "--pyspy", pyspy)
    assert r.returncode == 0 and r.stdout.startswith(f"Process {p.pid}: "), r.stdout + r.stderr
    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--dump", "1")
    assert r.returncode == 1 and "pid 1 is not a process of this run" in r.stderr, r.stderr


def test_no_trainer_and_bad_usage(host, tmp_path):
    r = cli("threads", *conn_args(host), "--run-dir", str(host.container_dir(CT) / "nothing-here"))
    assert r.returncode == 4 and "no trainer found for" in r.stderr, r.stderr
    r = cli("threads", *conn_args(host), "--interval", "0")
    assert r.returncode == 2 and "give 0.05 to 60 seconds" in r.stderr
    r = cli("threads", *conn_args(host), "extra-target")
    assert r.returncode == 2 and "threads acts on one run" in r.stderr
