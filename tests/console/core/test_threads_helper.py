"""The threads view's helper ops (``threads``, ``pyspy``) through the real SSH server (console/devhost) and
the pct stand-in, against a stand-in run of real processes (tests/support/threads_standin.py): its named
threads, CPU% that moves, a child that exits between samples, a hostile thread name, py-spy absent and
present, and the refusals (another process, a start time that is not the trainer's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from console.core import pyspy, threads
from console.core.events import TrainerInfo
from console.core.helper import Helper
from console.core.place import Proxmox
from console.core.ssh import connect
from console.core.threads import Sampler, ThreadsError
from tests.support.core_util import CT, alive, options_for, wait_until
from tests.support.devhost import devhost_fixture
from tests.support.threads_standin import (
    HOSTILE_SHOWN,
    no_pyspy_env,
    python_without_pyspy,
    threads_standin,
)

pytestmark = pytest.mark.e2e

VENV_BIN = Path(sys.executable).parent


host = devhost_fixture(asynchronous=True, env=no_pyspy_env)


@pytest.fixture
async def helper(host):
    conn = await connect(options_for(host))
    hp = await Helper.start(conn, place=Proxmox(CT))
    yield hp
    await hp.close()
    conn.close()


@pytest.fixture
def run(host, tmp_path):
    """The stand-in in the container, run by an interpreter with no py-spy beside it (a link to this one
    in a folder of its own); (its TrainerInfo, its child's pid, the run dir). Released at the end."""
    run_dir = host.container_dir(CT) / "run"
    python = python_without_pyspy(tmp_path / "py")
    with threads_standin(host.container_dir(CT), run_dir, python=python) as (_, child):
        info = json.loads((run_dir / "run.json").read_text())
        trainer = TrainerInfo(
            info["pid"], info["start_time"], info["command"], str(run_dir), "run.json", info
        )
        yield trainer, child, run_dir


async def _sample_until(helper, trainer, sampler, pred, what: str, tries: int = 200):
    """Samples ~0.1 s apart (on the helper's clock) until ``pred(snapshot)`` holds."""
    import asyncio

    for _ in range(tries):
        snap = sampler.feed(await threads.sample(helper, trainer, trainer.run_dir))
        if pred(snap):
            return snap
        await asyncio.sleep(0.1)
    raise AssertionError(f"no sample with {what}: last {threads.format_text(snap)}")


def _thread(snap, pid: int, name: str):
    return next(t for t in snap.find(pid).threads if t.name == name)


async def test_every_process_and_named_thread_with_cpu_that_moves(helper, run):
    trainer, child, _ = run
    sampler = Sampler()
    first = sampler.feed(await threads.sample(helper, trainer, trainer.run_dir))
    assert [p.pid for p in first.procs] == [trainer.pid, child]  # the trainer first, then its child
    assert first.interval_s is None and all(t.cpu_pct is None for p in first.procs for t in p.threads)
    root, kid = first.find(trainer.pid), first.find(child)
    assert root.role == "trainer" and kid.role == "target0"  # the child by its main thread's name
    names = {t.name for t in root.threads}
    assert {"dflash-launch", "dflash-spin", HOSTILE_SHOWN} <= names, names
    assert _thread(first, trainer.pid, "dflash-launch").main
    spin0 = _thread(first, trainer.pid, "dflash-spin").ticks

    snap = await _sample_until(
        helper, trainer, sampler, lambda s: _thread(s, trainer.pid, "dflash-spin").ticks > spin0, "spin ticks"
    )
    spin = _thread(snap, trainer.pid, "dflash-spin")
    assert spin.cpu_pct is not None and spin.cpu_pct > 0 and snap.interval_s > 0
    root = snap.find(trainer.pid)  # its ticks hold its threads' (the kernel rounds each a little)
    assert root.ticks >= sum(t.ticks for t in root.threads) - len(root.threads)
    rows = threads.rows(snap)
    assert (
        rows[0].key == f"p{trainer.pid}" and rows[0].process
    )  # the busiest process first, its threads under it
    group = [r.cpu_pct for r in rows[1 : 1 + len(root.threads)]]
    assert group == sorted(group, reverse=True) and not any(
        r.process for r in rows[1 : 1 + len(root.threads)]
    )
    assert snap.notes() == []


async def test_a_hostile_thread_name_arrives_cleaned(helper, run):
    trainer, _, _ = run
    snap = Sampler().feed(await threads.sample(helper, trainer, trainer.run_dir))
    text = threads.format_text(snap) + json.dumps(threads.to_json(snap), ensure_ascii=False)
    assert HOSTILE_SHOWN in text
    assert not any(c in text for c in ("\x1b", "\x07", "\x9b", "]0;pwn"))


async def test_a_process_that_exits_between_samples_is_said(helper, run):
    trainer, child, run_dir = run
    sampler = Sampler()
    assert sampler.feed(await threads.sample(helper, trainer, trainer.run_dir)).find(child) is not None
    (run_dir / "child-exit").touch()
    wait_until(lambda: not alive(child), 20, "the child's exit")
    snap = sampler.feed(await threads.sample(helper, trainer, trainer.run_dir))
    assert snap.find(child) is None and [p.pid for p in snap.procs] == [trainer.pid]
    assert snap.gone == (f"pid {child} (target0)",)
    assert f"pid {child} (target0) exited since the last sample" in snap.notes()
    assert snap.find(trainer.pid).cpu_pct is not None  # the rest goes on with its rates


async def test_a_pid_that_is_no_longer_the_trainer_is_refused(helper, run):
    trainer, child, _ = run
    wrong = TrainerInfo(trainer.pid, trainer.start_time + 1, trainer.cmdline, trainer.run_dir, "run.json")
    reply = await threads.sample(helper, wrong)
    assert reply["gone"] is True and "start time" in reply["why"]
    with pytest.raises(ThreadsError, match=f"pid {trainer.pid} is not the trainer"):
        Sampler().feed(reply)
    # a process that is not the trainer's at all (the child is its, but not the trainer itself)
    reply = await threads.sample(helper, TrainerInfo(child, 0, [], None, "cmdline"))
    assert reply["gone"] is True
    # py-spy only for the run's own processes: the helper itself is refused, nothing is run
    d = await pyspy.dump(helper, trainer, helper.pid)
    assert not d.ok and "not a process of this run" in d.text


async def test_pyspy_absent_is_said_plainly(helper, run):
    trainer, _, _ = run
    d = await pyspy.dump(helper, trainer, trainer.pid)
    assert not d.ok and not d.found
    assert d.text.startswith("py-spy is not in the container: looked at the helper's PATH")
    assert str(Path(trainer.run["interpreter"]).parent) not in d.text  # never beside the run's interpreter


def _planted(folder: Path, marker: Path, mode: int = 0o755) -> Path:
    """A py-spy that, run, writes ``marker`` (what a planted one would do as root, and worse)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "py-spy"
    exe.write_text(f"#!/bin/sh\necho ran >> {marker}\necho Process $3: planted\n")
    exe.chmod(mode)
    return exe


async def test_a_pyspy_beside_the_runs_interpreter_or_argv0_is_never_run(helper, run, tmp_path):
    """Whoever writes run.json names the interpreter; whoever owns the trainer chooses its argv[0]: a
    py-spy planted beside either is not run (the helper runs as root), whatever the request says."""
    trainer, _, _ = run
    marker = tmp_path / "ran"
    beside = Path(trainer.cmdline[0]).parent  # the stand-in's argv[0] and run.json's interpreter
    assert str(beside) == str(Path(trainer.run["interpreter"]).parent)
    _planted(beside, marker)
    d = await pyspy.dump(helper, trainer, trainer.pid)
    assert not d.ok and not d.found and str(beside) not in d.text, d.text
    # an older console's request naming the interpreter: the helper does not look there either
    reply = await helper.call(
        "pyspy", root=trainer.pid, start_time=trainer.start_time, pid=trainer.pid,
        run_dir=trainer.run_dir, interpreter=str(beside / "python3"),
    )  # fmt: skip
    assert reply["ran"] is False and reply["found"] is False
    assert not marker.exists()


async def test_a_configured_pyspy_others_can_swap_is_refused(helper, run, tmp_path):
    """The operator's py-spy is taken only when it and its folders are root's (or the helper user's) and
    writable by nobody else; each refusal says why, and nothing is run."""
    trainer, _, _ = run
    marker = tmp_path / "ran"
    loose = _planted(tmp_path / "loose", marker, 0o775)
    d = await pyspy.dump(helper, trainer, trainer.pid, configured=str(loose))
    assert not d.found and "is writable by group or others (-rwxrwxr-x)" in d.text, d.text
    open_dir = _planted(tmp_path / "open", marker)
    open_dir.parent.chmod(0o777)
    d = await pyspy.dump(helper, trainer, trainer.pid, configured=str(open_dir))
    assert not d.found and f"{open_dir.parent} is writable by group or others" in d.text, d.text
    via = tmp_path / "via"  # a linked folder is judged where it points
    via.symlink_to(open_dir.parent)
    d = await pyspy.dump(helper, trainer, trainer.pid, configured=str(via / "py-spy"))
    assert not d.found and "is writable by group or others" in d.text, d.text
    d = await pyspy.dump(helper, trainer, trainer.pid, configured="py-spy")
    assert not d.found and "not an absolute path" in d.text
    if os.geteuid() == 0:
        theirs = _planted(tmp_path / "theirs", marker)
        os.chown(theirs, 65534, 65534)
        d = await pyspy.dump(helper, trainer, trainer.pid, configured=str(theirs))
        assert not d.found and "belongs to uid 65534" in d.text, d.text
    assert not marker.exists()
    good = _planted(tmp_path / "good", marker)  # root's, 0755 in a 0755 folder: run
    d = await pyspy.dump(helper, trainer, trainer.pid, configured=str(good))
    assert d.ok and d.path == str(good) and f"Process {trainer.pid}: planted" in d.text, d.text
    assert marker.read_text() == "ran\n"


async def test_pyspy_dump_of_the_run_through_the_helper(helper, run):
    """py-spy (the test extra) where the operator says: the stacks of the stand-in's threads."""
    assert (VENV_BIN / "py-spy").is_file(), "py-spy is in the test extra (pip install -e '.[test]')"
    trainer, child, _ = run
    configured = str(VENV_BIN / "py-spy")
    d = await pyspy.dump(helper, trainer, trainer.pid, configured=configured)
    assert d.ok, d.text
    assert d.path == configured
    assert f"Process {trainer.pid}" in d.text and "spin (" in d.text and "hostile (" in d.text
    d = await pyspy.dump(helper, trainer, child, configured=configured)  # a descendant: allowed too
    assert d.ok and f"Process {child}" in d.text, d.text
