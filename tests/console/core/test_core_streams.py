"""Tails across a dropped link: the SSH server restarts mid-stream, nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import sys

import pytest

from console.core.events import ConnState, LogLines, Record
from console.core.place import Proxmox
from console.core.session import Session
from console.core.streams import LineSplitter
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_async

pytestmark = pytest.mark.e2e

N = 400
# Appends numbered metrics records and log lines, each written in two halves (a torn line is on
# disk between them), for about 2.5 s.
WRITER = r"""
import json, sys, time
run = sys.argv[1]
with open(run + "/metrics.jsonl", "ab", buffering=0) as m, open(run + "/train.log", "ab", buffering=0) as g:
    for i in range(int(sys.argv[2])):
        rec = json.dumps({"t": time.time(), "kind": "step", "step": i, "note": "x" * (i % 50)}).encode() + b"\n"
        m.write(rec[:7]); g.write(b"line ")
        time.sleep(0.003)
        m.write(rec[7:]); g.write(b"%d\n" % i)
        time.sleep(0.003)
"""


async def test_server_restart_mid_stream_loses_and_doubles_nothing(tmp_path):
    async with devhost_async(tmp_path / "host") as h:
        run = tmp_path / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_bytes(b'{"t": 1, "kind": "step", "step": -1}\n')
        steps: list[int] = []
        lines: list[str] = []
        states: list[str] = []

        def on(ev) -> None:
            if isinstance(ev, Record):
                steps.append(ev.record["step"])
            elif isinstance(ev, LogLines):
                lines.extend(ev.lines)
            elif isinstance(ev, ConnState):
                states.append(ev.state)

        s = Session(options_for(h), place=Proxmox(CT), run_dir=str(run), telemetry=False)
        s.subscribe(on)
        await s.start()
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, str(run), str(N))
        try:
            for _ in range(2):
                await asyncio.sleep(0.6)
                await h.restart(pause=0.3)  # every connection dropped, helper killed, port closed a while
            assert await asyncio.wait_for(writer.wait(), 60) == 0
            size_m = (run / "metrics.jsonl").stat().st_size
            size_l = (run / "train.log").stat().st_size
            for _ in range(600):
                if s.offsets == {"metrics": size_m, "log": size_l}:
                    break
                await asyncio.sleep(0.05)
        finally:
            if writer.returncode is None:
                writer.kill()
            await s.close()
    assert states.count("reconnecting") >= 2 and states.count("connected") >= 3, states
    assert steps == list(range(-1, N))
    assert lines == [f"line {i}" for i in range(N)]


def test_line_splitter_keeps_partial_lines_and_skips_a_cut_first_line():
    sp = LineSplitter(skip_first=True)
    assert sp.feed(b"ut line\nfirst") == []
    assert sp.feed(b" whole\nsecond\r\nthi") == ["first whole", "second"]
    assert sp.feed(b"rd\n") == ["third"]


async def test_subscribe_replays_only_the_current_state(tmp_path):
    async with devhost_async(tmp_path / "host") as h:
        run = tmp_path / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"t": 1, "kind": "step", "step": 1}\n')
        s = Session(options_for(h), place=Proxmox(CT), run_dir=str(run), telemetry=False)
        first: list = []
        s.subscribe(first.append)
        await s.start()
        for _ in range(100):
            if any(isinstance(e, Record) for e in first):
                break
            await asyncio.sleep(0.02)
        late: list = []
        s.subscribe(late.append)
        await s.close()
    assert [type(e).__name__ for e in late[:2]] == ["ConnState", "TrainerFound"]
    assert late[0].state == "connected" and late[1].trainer is None
    assert not any(isinstance(e, Record) for e in late)
    assert [e.record["step"] for e in first if isinstance(e, Record)] == [1]


async def test_a_call_racing_the_connect_attaches_the_tails_once(tmp_path):
    """A find_trainer (or launch) made the moment the helper is up, while connect is still attaching
    the tails, must not attach a second pair: every log line arrives once."""
    async with devhost_async(tmp_path / "host") as h:
        run = tmp_path / "run"
        run.mkdir()
        (run / "train.log").write_bytes(b"")
        lines: list[str] = []
        s = Session(options_for(h), place=Proxmox(CT), run_dir=str(run), telemetry=False)
        s.subscribe(lambda ev: lines.extend(ev.lines) if isinstance(ev, LogLines) else None)
        starting = asyncio.create_task(s.start())
        try:
            while not s.connected:  # the helper is up; connect is now attaching the tails
                await asyncio.sleep(0.001)
            await s.find_trainer()
            await starting
            with open(run / "train.log", "ab") as f:
                f.write(b"".join(b"line %d\n" % i for i in range(20)))
            for _ in range(100):
                if len(lines) >= 20:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a second pair of tails would deliver its copy meanwhile
        finally:
            await s.close()
    assert lines == [f"line {i}" for i in range(20)]


async def test_a_train_log_the_helper_refuses_to_follow_is_said_in_the_log_pane(tmp_path):
    """train.log as a FIFO: the helper refuses it at once; the session says so once in the log pane (the
    pane no longer stays silently empty), and metrics.jsonl beside it is followed as before."""
    import os

    async with devhost_async(tmp_path / "host") as h:
        run = tmp_path / "run"
        run.mkdir()
        os.mkfifo(run / "train.log")
        (run / "metrics.jsonl").write_bytes(b'{"t": 1, "kind": "step", "step": 7}\n')
        lines: list[str] = []
        steps: list[int] = []

        def on(ev) -> None:
            if isinstance(ev, LogLines):
                lines.extend(ev.lines)
            elif isinstance(ev, Record):
                steps.append(ev.record["step"])

        s = Session(options_for(h), place=Proxmox(CT), run_dir=str(run), telemetry=False)
        s.subscribe(on)
        await s.start()
        try:
            for _ in range(600):
                if any("not followed" in x for x in lines) and steps:
                    break
                await asyncio.sleep(0.05)
        finally:
            await s.close()
    said = [x for x in lines if "not followed" in x]
    assert len(said) == 1 and "train.log" in said[0] and "FIFO" in said[0], lines
    assert steps == [7]
