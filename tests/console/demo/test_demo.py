"""`dflash-console demo --headless` as a user runs it: a real local SSH host, the real tiny trainer
deployed and launched through the console, a status line a second; interrupted, it stops the trainer
cleanly and leaves no process behind. A rerun with the same --dir (with the screen) resumes from the
checkpoint, and quitting the screen stops the trainer cleanly too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from console.core.events import TrainerFound
from console.demo import Demo, marked_processes
from console.demo.screen import demo_app
from tests.support.core_util import CLI, alive
from tests.support.screen_text import until
from tests.support.trainer_run import ROOT, env

pytestmark = pytest.mark.e2e

STATUS = re.compile(
    r"step (\d+)/\d+\s+loss ([0-9.]+)\s+accept_len ([0-9.]+)\s+tok/s (\d+)\s+queue (\d+)/(\d+)"
)


class Headless:
    """``dflash-console demo --headless --dir DIR`` in its own session; its output read by a thread."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(
            [*CLI, "demo", "--headless", "--dir", str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env(),
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, pred, timeout: float, what: str):
        """The first line (from now) for which ``pred`` returns something truthy; returns that."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._q.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            got = pred(line)
            if got:
                return got
        raise AssertionError(f"no {what} within {timeout:.0f} s; output:\n" + "\n".join(self.lines[-40:]))

    def finish(self, sig: int, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        while True:
            line = self._q.get(timeout=5)
            if line is None:
                return rc
            self.lines.append(line)

    def end(self) -> None:
        """After a failure: SIGINT (the demo stops its trainer), else SIGKILL; then end any process
        still running in the demo's folder (a detached trainer outlives a killed demo)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for line in leftovers(self.folder, self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def leftovers(folder: Path, sid: int | None) -> list[str]:
    """Live processes that belong to the demo: in its session, run in its folder, or naming it."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == sid or str(folder) in cmd or _cwd(pid).startswith(str(folder)):
            out.append(f"{pid} {cmd[:160]}")
    return out


def seed_tiny(folder: Path, tiny: Path) -> None:
    """Put the session's tiny target and data where the demo looks for them (it skips its own build)."""
    ct_tiny = folder / "host" / "ct" / "200" / "tiny"
    ct_tiny.mkdir(parents=True)
    for part in ("target", "data"):
        shutil.copytree(tiny / part, ct_tiny / part)
    (folder / ".dflash-demo").write_text("{}\n")


@pytest.mark.e2e
async def test_headless_demo_trains_and_stops_clean_then_the_screen_resumes(tmp_path, tiny_assets):
    folder = tmp_path / "demo dir"
    seed_tiny(folder, tiny_assets)
    run_dir = folder / "host" / "ct" / "200" / "runs" / "demo"

    headless = Headless(folder)
    try:
        m = headless.wait_for(
            lambda ln: (m := STATUS.search(ln)) and int(m[4]) > 0 and m,
            120,
            "status line with tok/s above zero",
        )
        assert float(m[2]) > 0 and int(m[6]) > 0  # a loss; the queue has a capacity
        rc = headless.finish(signal.SIGINT)
        out = "\n".join(headless.lines)
        assert rc == 0, out
        assert "[saved] checkpoint saved" in out and "demo ended; nothing of it is left running" in out, out
        assert leftovers(folder, headless.proc.pid) == []
    finally:
        headless.end()  # (only acts after a failure above)
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    first_ckpt = int(re.search(r"step_(\d+)", latest)[1])
    assert (run_dir / "checkpoints" / latest).is_dir() or Path(latest).is_dir()
    first_pid = json.loads((run_dir / "run.json").read_text())["pid"]
    assert not alive(first_pid)

    # The same --dir again, now with the screen (the demo's app under Textual's pilot, in this process):
    # the run resumes from that checkpoint, each trainer log line shows once, and q stops it cleanly.
    said: list[str] = []
    demo = Demo(folder, temp=False, say=said.append)
    demo.claim_dir()
    try:
        await demo.start_host()
        app = demo_app(demo, demo.session(telemetry=False))
        async with app.run_test(size=(120, 36)) as pilot:
            st = app.state
            await until(
                pilot,
                lambda: st.trainer is not None and (st.step or 0) > first_ckpt,
                120,
                "the resumed run's steps on screen",
            )
            pid = st.trainer.pid
            lines = app.log_view.source_lines  # (as received: a line wider than the pane wraps on screen)
            assert any(f"resuming from {latest}" in ln for ln in lines), lines
            shown = [ln for ln in lines if not ln.startswith("[demo] ")]  # train.log's lines, each once
            log = (run_dir / "train.log").read_text().splitlines()
            assert shown and any(log[k : k + len(shown)] == shown for k in range(len(log))), lines
            assert st.health.alerts() == [] and list(st.health.past) == []  # the demo raises nothing
            await pilot.press("q")
            end = time.monotonic() + 60
            while app.is_running and time.monotonic() < end:
                await asyncio.sleep(0.1)
        assert not alive(pid)
        st.health.apply(TrainerFound(None))  # (the screen is gone: the clean stop is all it saw)
        app.state.clock = lambda: time.time() + 5
        st.health.clock = app.state.clock
        st.health.evaluate()
        assert st.health.alerts() == [] and list(st.health.past) == [], st.health.alerts()
        assert any("[saved] checkpoint saved" in ln for ln in app.after), app.after
    finally:
        clean = await demo.shutdown(None, said.append)
        demo.release_dir()
    assert clean, said
    assert leftovers(folder, None) == [] and marked_processes(demo.token) == []
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [r["step"] for r in records if r["kind"] == "event" and r["name"] == "started"]
    assert starts == [0, first_ckpt]


def test_demo_refuses_a_foreign_nonempty_dir(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me\n")
    r = subprocess.run(
        [*CLI, "demo", "--headless", "--dir", str(folder)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1
    assert "not empty and not a demo directory" in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_demo_screen_needs_a_terminal(tmp_path):
    r = subprocess.run(
        [*CLI, "demo", "--dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2
    assert "--headless" in r.stderr
    assert not (tmp_path / "d").exists()


def test_demo_without_torch_says_how_to_install(tmp_path):
    # An interpreter where torch cannot be found (a console-only install): the demo says what to install.
    code = (
        "import sys; sys.modules['torch'] = None; from console.cli import main; "
        f"sys.exit(main(['demo', '--headless', '--dir', {str(tmp_path / 'd')!r}]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1
    assert "torch" in r.stderr and "pip install '.[trainer]'" in r.stderr and "make demo" in r.stderr
    assert not (tmp_path / "d").exists()


async def test_the_hint_for_another_terminal_reaches_the_demos_trainer_among_others(tmp_path):
    """The screen's "from another terminal" command, pasted into a shell as shown: one short line (the flags
    themselves are wider than the pane: a script in the demo's directory holds them) that names the run
    dir: with another trainer in the same container it still reaches the demo's (without --run-dir the CLI
    asks which one, exit 2)."""
    from tests.support.core_util import start_user_script

    demo = Demo(tmp_path / "d", temp=False, say=lambda _: None)
    demo.claim_dir()
    await demo.start_host()
    procs = []
    try:
        Path(demo.run_dir).mkdir(parents=True)
        other = demo.ct_dir / "other"
        other.mkdir()
        procs = [start_user_script(demo.ct_dir, demo.run_dir), start_user_script(other, str(other / "run"))]
        hint = demo.cli_hint()
        command = hint.split("   (")[0]
        assert "\n" not in hint and command == f"{demo.root / 'demo-cli'} status", hint  # as short as its dir
        shell = await asyncio.to_thread(  # (the host serves on this loop)
            subprocess.run,
            ["sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert shell.returncode == 0, shell.stderr
        assert f"trainer: pid {procs[0].pid}" in shell.stdout and f"run dir: {demo.run_dir}\n" in shell.stdout
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        await demo.host.stop()
        demo.release_dir()
