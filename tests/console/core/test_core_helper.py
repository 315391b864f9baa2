"""The remote helper through a real SSH server (console/devhost) and the pct stand-in."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.core.helper import (
    CALL_S,
    Helper,
    HelperError,
    HelperGone,
    HelperStartError,
    HelperTimeout,
    b64decode,
    call_limit,
)
from console.core.place import Proxmox
from console.core.ssh import connect
from tests.support.core_util import CT, alive, options_for, start_time, start_user_script, wait_until
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

NASTY = "run dir 'q' \"dq\" $(touch PWNED) ; touch PWNED2 `touch PWNED3` \\ *"


host = devhost_fixture(asynchronous=True)


@pytest.fixture
async def helper(host):
    conn = await connect(options_for(host))
    hp = await Helper.start(conn, place=Proxmox(CT))
    yield hp
    await hp.close()
    conn.close()


async def test_hello_runs_inside_the_container(helper, host):
    assert helper.hello["pidfd"] is True  # this kernel has pidfd_open: exit is seen at once
    assert helper.home == str(host.container_dir(CT))
    info = await helper.proc(helper.pid)
    assert info["cmdline"][1] == "-c"  # started as `python3 -c BOOTSTRAP`, nothing installed
    assert info["cwd"] == str(host.container_dir(CT))


async def test_argv_with_shell_metacharacters_reaches_the_remote_intact(helper, host, tmp_path):
    r = await helper.run(["printf", "%s\n", NASTY, "a;b"], cwd=str(tmp_path))
    assert r["rc"] == 0 and r["stdout"] == f"{NASTY}\na;b\n"
    d = tmp_path / NASTY
    await helper.call("mkdir", path=str(d))
    assert d.is_dir()
    assert not any(
        (p / n).exists()
        for p in (tmp_path, host.container_dir(CT), host.root / "home")
        for n in ("PWNED", "PWNED2", "PWNED3")
    )


async def test_requests_run_concurrently(helper):
    slow = asyncio.ensure_future(helper.run(["sleep", "1"]))
    for _ in range(20):  # answered while the slow one is still running
        assert (await helper.call("ping"))["t"] > 0
    assert not slow.done()
    assert (await slow)["rc"] == 0


async def test_spawn_detached_wait_exit_and_log(helper, tmp_path):
    log = tmp_path / "out" / "x.log"
    sp = await helper.call(
        "spawn",
        argv=[
            sys.executable,
            "-c",
            "import os,sys; print('sid', os.getsid(0) == os.getpid());"
            "sys.stdout.flush(); os.write(2, b'err\\n'); sys.exit(3)",
        ],
        log=str(log),
    )
    r = await helper.call("wait_exit", pid=sp["pid"], start_time=sp["start_time"])
    assert r["exited"] and r["rc"] == 3
    assert log.read_text().splitlines() == ["sid True", "err"]  # own session; stdout+stderr appended


async def _started(p: subprocess.Popen, cmdline: bytes) -> None:
    """Popen returns once exec has begun; /proc/PID/cmdline reads empty until the new program's arguments
    are in place (a window that a loaded machine widens): wait for them."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{p.pid}/cmdline").read_bytes() != cmdline:
        assert time.monotonic() < deadline, f"{cmdline!r} never showed its command line"
        await asyncio.sleep(0.01)


async def test_kill_checks_the_process_first(helper, tmp_path):
    p = start_user_script(tmp_path, str(tmp_path / "run"))  # python .../train_dflash_pipeline.py ...
    try:
        st = start_time(p.pid)
        rest = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[1:-1]
        rest = [a.decode() for a in rest]
        r = await helper.call("kill", pid=p.pid, sig="SIGINT", expect={"start_time": st + 1})
        assert r == {**r, "sent": False, "reason": "mismatch"}
        r = await helper.call("kill", pid=p.pid, sig="SIGINT", expect={"argv_rest": ["31"]})
        assert not r["sent"] and alive(p.pid)
        r = await helper.call("kill", pid=p.pid, sig="SIGTERM", expect={"start_time": st, "argv_rest": rest})
        assert r["sent"], r
        assert p.wait(5) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()


async def test_kill_never_signals_what_is_not_a_trainer(helper):
    """A process whose start time and command line are given exactly is still refused when it is not a
    trainer, and so are PID 1 and the helper itself, whatever ``expect`` says."""
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        await _started(p, b"sleep\x0030\x00")
        exact = {"start_time": start_time(p.pid), "argv_rest": ["30"]}
        r = await helper.call("kill", pid=p.pid, sig="SIGTERM", expect=exact)
        assert not r["sent"] and r["reason"] == "mismatch" and "not the trainer's" in r["why"], r
        own = await helper.proc(helper.pid)
        me = {"start_time": own["start_time"], "argv_rest": own["cmdline"][1:]}
        r = await helper.call("kill", pid=helper.pid, sig="SIGCONT", expect=me)
        assert not r["sent"] and "this helper or one of its parents" in r["why"], r
        r = await helper.call("kill", pid=1, sig="SIGCONT", expect={})
        assert not r["sent"] and r["reason"] == "mismatch", r
        await asyncio.sleep(0.2)
        assert alive(p.pid) and p.poll() is None
    finally:
        p.kill()
        p.wait()


async def test_follow_pushes_appended_bytes_from_an_offset(helper, tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"0123456789")
    got: list[bytes] = []
    st = helper.stream(
        "follow",
        lambda p: got.append(b64decode(p["data"])) if "data" in p else None,
        path=str(f),
        offset=4,
        interval=0.02,
    )
    with f.open("ab") as w:
        w.write(b"abc")
    await asyncio.sleep(0.3)
    await st.cancel()
    assert (await st.done)["offset"] == 13
    assert b"".join(got) == b"456789abc"


async def test_unknown_op_and_missing_file_are_errors_not_crashes(helper):
    with pytest.raises(HelperError) as e:
        await helper.call("nope")
    assert e.value.kind == "ValueError"
    with pytest.raises(HelperError) as e:
        await helper.read("/nonexistent/file")
    assert e.value.kind == "FileNotFoundError"
    assert (await helper.call("ping"))["t"] > 0


async def test_helper_dies_with_its_channel(host):
    conn = await connect(options_for(host))
    hp = await Helper.start(conn, place=Proxmox(CT))
    pid = hp.pid
    assert alive(pid)
    conn.close()  # the link goes: stdin EOF, the helper leaves
    await asyncio.wait_for(hp.wait_closed(), 5)
    with pytest.raises(HelperGone):
        await hp.call("ping")
    await asyncio.to_thread(wait_until, lambda: not alive(pid), 5, "helper exit")


def _ancestors(pid: int) -> set[int]:
    """``pid`` and its parents up to this test's process (as /proc says): the helper and its starters."""
    out = set()
    while pid > 1 and pid != os.getpid() and pid not in out:
        out.add(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return out


async def test_pgrep_for_the_trainer_lists_only_trainers_never_the_helper(helper, tmp_path):
    """Issue 54, item 2: the helper's program travels on stdin, so neither the helper nor the commands
    that started it (``sh -c``, ``pct exec``) match a user's ``pgrep -af trainer.pipeline``; its command
    line and comm name it."""
    trainer = start_user_script(tmp_path, str(tmp_path / "run"))
    try:
        for pattern in ("train_dflash_pipeline.py", "trainer.pipeline"):
            r = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, timeout=30)
            pids = {int(ln.split()[0]) for ln in r.stdout.splitlines()}
            assert not pids & _ancestors(helper.pid), r.stdout  # neither the helper nor its starters
            if pattern.endswith(".py"):
                assert trainer.pid in pids, r.stdout
        cmdline = Path(f"/proc/{helper.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[-2] == b"dflash-console-helper" and len(b" ".join(cmdline)) < 200, cmdline
        assert Path(f"/proc/{helper.pid}/comm").read_text().strip() == "dflash-console-"
        assert await helper.call("ping") is not None  # the requests follow on the same stdin
    finally:
        trainer.kill()
        trainer.wait(10)


async def test_no_such_container_is_said(host):
    conn = await connect(options_for(host))
    try:
        with pytest.raises(HelperStartError, match="container 999.*does not exist"):
            await Helper.start(conn, place=Proxmox(999))
    finally:
        conn.close()


def test_helper_program_is_stdlib_only():
    import ast

    from console.core.helper_program import program_text

    names = set()
    for node in ast.walk(ast.parse(program_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names and names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


async def test_only_regular_files_are_read_and_links_never_followed(helper, tmp_path):
    """A FIFO (whose open would wait for a writer forever), a device (endless) and a symlink are refused
    at once, naming what they are; the helper answers on."""
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    secret = tmp_path / "secret"
    secret.write_bytes(b"key")
    (tmp_path / "train.log").symlink_to(secret)
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "sub").symlink_to(tmp_path)  # a folder swapped for a link after the listing
    for call, kind, text in (
        (helper.read("sub/secret", root=str(tmp_path / "export")), "SymlinkRefused", f"(to {tmp_path})"),
        (helper.read(str(fifo)), "NotRegularFile", f"{fifo} is a FIFO, not a regular file"),
        (helper.call("sha256", path="/dev/zero"), "NotRegularFile", "/dev/zero is a character device"),
        (helper.read(str(tmp_path / "train.log")), "SymlinkRefused", f"a symbolic link (to {secret})"),
        (helper.call("sha256", path="b", root=str(tmp_path)), "FileNotFoundError", "b"),
    ):
        with pytest.raises(HelperError) as e:
            await asyncio.wait_for(call, 60)
        assert e.value.kind == kind and text in str(e.value), (kind, str(e.value))
    st = helper.stream("follow", lambda p: None, path=str(fifo), interval=0.02)
    with pytest.raises(HelperError, match="is a FIFO"):
        await asyncio.wait_for(st.done, 60)
    assert (await helper.call("ping"))["t"] > 0


async def test_a_call_not_answered_in_time_is_a_clear_error(helper):
    with pytest.raises(HelperTimeout, match=r"did not answer `run sleep 5` within 1 s"):
        await helper.call("run", argv=["sleep", "5"], wait_s=1)
    assert (await helper.call("ping"))["t"] > 0
    assert call_limit("read", {"path": "/x"}) == CALL_S and call_limit("run", {"timeout": 15}) == 45
    assert call_limit("wait_exit", {}) is None  # the caller holds the deadline (and cancels it)


async def test_a_checkpoint_the_trainer_set_aside_is_never_listed_as_complete(helper, tmp_path):
    """``step_N.bad`` (trainer/run/checkpoint.py: a checkpoint that did not verify, kept for inspection) has a
    manifest but is not offered as complete; the good one beside it is."""
    for name in ("step_00000002", "step_00000004.bad"):
        d = tmp_path / "checkpoints" / name
        (d / "export").mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002\n")
    out = await asyncio.wait_for(helper.call("checkpoints", path=str(tmp_path)), 60)
    complete = {e["name"]: e["complete"] for e in out["entries"]}
    assert complete == {"step_00000002": True, "step_00000004.bad": False}


async def test_a_linked_export_is_listed_with_the_reason_it_is_not_offered(helper, tmp_path):
    """A checkpoint whose export/ is a symbolic link: the listing names the link's target, and the entry the
    checkpoints view shows carries that reason instead of a drafter to copy."""
    from console.core.checkpoints import parse

    d = tmp_path / "checkpoints" / "step_00000002"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    (d / "export").symlink_to(tmp_path / "elsewhere")
    out = await asyncio.wait_for(helper.call("checkpoints", path=str(tmp_path)), 60)
    (entry,) = parse(str(tmp_path), out).checkpoints
    assert entry.export is None
    assert entry.refused and str(tmp_path / "elsewhere") in entry.refused, entry


async def test_a_command_past_its_timeout_is_killed_with_its_children(helper, tmp_path):
    """Issue 55: a hung command (nvidia-smi) is killed with what it started, not left behind per call;
    status says it timed out, naming how long it waited."""
    from console.core import status

    child = tmp_path / "child"
    hang = tmp_path / "nvidia-smi"
    hang.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {child}\nwait\n")
    hang.chmod(0o755)
    t0 = time.monotonic()
    r = await helper.run([str(hang)], timeout=1)
    assert r["timed_out"] and r["rc"] is None and time.monotonic() - t0 < 20
    pid = int(child.read_text())
    await asyncio.to_thread(wait_until, lambda: not alive(pid), 10, "the hung command's child to go")

    old = status.nvidia_smi_argv, status.NVIDIA_SMI_TIMEOUT_S
    status.nvidia_smi_argv, status.NVIDIA_SMI_TIMEOUT_S = (lambda _ms: [str(hang)]), 1.0
    try:
        said = await status._gpus(helper, None, None)
    finally:
        status.nvidia_smi_argv, status.NVIDIA_SMI_TIMEOUT_S = old
    assert said == {"gpu_detail": "nvidia-smi timed out after 1 s (killed)"}


async def test_replies_over_the_channels_buffer_are_read_and_too_long_ones_said(helper):
    """Issue 55: a reply longer than asyncssh's buffer (~2 MB) is read whole; one over the helper's limit
    (8 MiB) fails at once, naming the request, instead of leaving the call to wait out its limit."""
    script = "import sys; sys.stdout.write('x' * int(sys.argv[1]))"
    r = await helper.call(
        "run", argv=[sys.executable, "-c", script, str(5 << 20)], max_output=6 << 20, wait_s=60
    )
    assert len(r["stdout"]) == 5 << 20
    t0 = time.monotonic()
    with pytest.raises(HelperError, match=r"answer to `run .*` was not read: it is 1\d\.\d MiB long") as e:
        await helper.call(
            "run", argv=[sys.executable, "-c", script, str(10 << 20)], max_output=12 << 20, wait_s=60
        )
    assert e.value.kind == "ReplyTooLong" and time.monotonic() - t0 < 30
    assert await helper.call("ping") is not None  # the channel goes on


async def test_find_cuts_the_command_lines_it_returns(helper):
    """Issue 55: other users' processes with megabyte command lines that mention trainer.pipeline do not
    make ``find`` (status, restart) wait out its limit: each command line comes back cut."""
    arg = "trainer.pipeline " + "a" * (120 << 10)
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *[arg] * 11])
        for _ in range(3)
    ]
    try:
        found = await helper.call("find", patterns=["trainer.pipeline"], wait_s=60)
        ours = [f for f in found if f["pid"] in {p.pid for p in procs}]
        assert len(ours) == 3
        assert all(f["cmdline_cut"] and sum(map(len, f["cmdline"])) < 17 << 10 for f in ours)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


async def test_a_line_over_the_consoles_limit_fails_its_request_by_id():
    """The console's own bound (helper.MAX_LINE): a reply line longer than it is dropped part by part
    as asyncssh hands it over, and its request fails saying so."""
    from console.core import helper as helper_mod

    class Stdout:
        def __init__(self) -> None:
            self.q: asyncio.Queue[bytes] = asyncio.Queue()

        async def readline(self) -> bytes:
            return await self.q.get()

    class Proc:
        stdout = Stdout()

        class stdin:  # noqa: N801 - the shape of asyncssh's writer
            @staticmethod
            def write(data: bytes) -> None:
                pass

    hp = Helper(Proc(), {"pid": 1, "home": "/"})
    call = asyncio.ensure_future(hp.call("find", patterns=["x"]))
    await asyncio.sleep(0)
    part = b'{"id":1,"ok":true,"result":"' + b"a" * (2 << 20)
    for _ in range(helper_mod.MAX_LINE // len(part) + 2):
        Proc.stdout.q.put_nowait(part)
    Proc.stdout.q.put_nowait(b'"}\n')
    with pytest.raises(HelperError, match=r"answer to `find` was not read: it is 1\d\.\d MiB long"):
        await asyncio.wait_for(call, 10)
    Proc.stdout.q.put_nowait(b"")
    await asyncio.wait_for(hp.wait_closed(), 5)


async def test_the_screens_nvidia_smi_ends_with_its_channel_even_hung(host, tmp_path):
    """Issue 55: the long-lived nvidia-smi of the telemetry channel, hung, is killed when the console
    closes its channel (a quit), not left behind."""
    from console.core.telemetry import Telemetry

    fake = Path(host.bin_dir) / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 300\n")
    fake.chmod(0o755)
    conn = await connect(options_for(host))
    try:
        tel = Telemetry(lambda _e: None, place=Proxmox(CT))
        tel.start(conn)
        await asyncio.to_thread(wait_until, lambda: (tmp_path / "pid").exists(), 30, "nvidia-smi to start")
        pid = int((tmp_path / "pid").read_text())
        assert alive(pid)
        await tel.stop()
    finally:
        conn.close()
        fake.unlink()
    await asyncio.to_thread(wait_until, lambda: not alive(pid), 10, "the hung nvidia-smi to go")
