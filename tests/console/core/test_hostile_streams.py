"""Hostile input on every stream: a 10 MB line without a newline, binary bytes, a truncated JSON record,
a metrics record with wrong types, a train.log truncated or replaced (rotated) while followed. Each is
skipped or resynchronised with a note; nothing crashes and memory stays bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import pytest

from console.core.events import LogLines, Record
from console.core.metrics import MAX_RECORD, MetricsParser
from console.core.place import Proxmox
from console.core.session import Session
from console.core.state import ConsoleState
from console.core.streams import MAX_LINE, LineSplitter
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_async

pytestmark = pytest.mark.e2e

BIG = 10 << 20


async def until_async(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def rec(**kw) -> bytes:
    return json.dumps({"t": 1.0, **kw}).encode() + b"\n"


def test_a_10mb_line_without_newline_is_cut_in_bounded_memory():
    split = LineSplitter()
    out: list[str] = []
    for _ in range(BIG // (1 << 20)):
        out += split.feed(b"x" * (1 << 20))
        assert len(split._buf) <= MAX_LINE  # never the whole line
    assert len(out) == 1 and len(out[0]) == MAX_LINE + 2 and out[0].endswith(" …")
    out = split.feed(b"tail\nnext line\n")
    assert out == [f"[dflash-console: the line above was {BIG + 4:,} bytes long; cut]", "next line"]

    parser = MetricsParser()
    got = []
    for _ in range(BIG // (1 << 20)):
        got += parser.feed(b"y" * (1 << 20))
        assert len(parser.pending) <= MAX_RECORD
    got += parser.feed(b"}\n" + rec(kind="step", step=3))
    assert [r["step"] for r in got] == [3] and parser.bad_lines == 1


def test_binary_and_control_bytes_become_replacement_characters():
    out = LineSplitter().feed(b"ok \xff\xfe\x00\x1b[2J end\nprogress 10%\rprogress 90%\r\n")
    assert out == ["ok \ufffd\ufffd\ufffd\ufffd end", "progress 90%"]  # the whole ESC [ 2 J is one
    parser = MetricsParser()
    assert parser.feed(b"\x00\xff\xfe garbage\n" + rec(kind="step", step=1)) == [
        {"t": 1.0, "kind": "step", "step": 1}
    ]
    assert parser.bad_lines == 1


async def test_session_survives_hostile_metrics_and_a_rotated_log(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    run = tmp_path / "run"
    run.mkdir()
    metrics, log = run / "metrics.jsonl", run / "train.log"
    metrics.write_bytes(rec(kind="step", step=1, total_steps=10, loss=2.0))
    log.write_bytes(b"first line\n")
    state = ConsoleState()
    lines: list[str] = []

    def on(ev) -> None:
        state.apply(ev)
        if isinstance(ev, LogLines):
            lines.extend(ev.lines)

    async with devhost_async(tmp_path / "host") as h:
        s = Session(options_for(h), place=Proxmox(CT), run_dir=str(run), telemetry=False)
        s.subscribe(on)
        records: list[dict] = []
        s.subscribe(lambda ev: records.append(ev.record) if isinstance(ev, Record) else None)
        await s.start()
        try:
            await until_async(lambda: state.step == 1 and "first line" in lines, 30, "the start")
            with open(metrics, "ab") as f:
                f.write(b"z" * BIG)  # no newline yet
                f.flush()
                await until_async(lambda: s.offsets["metrics"] >= f.tell(), 60, "the 10 MB read")
                f.write(b"\n\x00\xff\xfe\n")  # binary
                f.write(b'{"t": 1.0, "kind": "step", "st\n')  # a truncated record
                # wrong types everywhere
                f.write(
                    rec(kind="step", step="9", loss="low", acc="abc", total_steps=[1], lr={}, tokens=None)
                )
                f.write(rec(kind="throughput", devices="gpu", queue=[1, 2]))
                f.write(
                    rec(kind="event", name="checkpoint_saved", step="x", path=7, bytes="big", seconds="s")
                )
                f.write(rec(kind="event", name=["stopped"], reason=None))
                f.write(rec(kind="step", step=2, total_steps=10, loss=1.5))
            await until_async(lambda: state.step == 2, 30, "the good record after the bad ones")
            assert state.loss == 1.5
            notes = [ln for ln in lines if ln.startswith("[dflash-console] metrics.jsonl: skipped")]
            assert notes and "3 so far" in notes[-1], lines[-5:]

            with open(log, "ab") as f:
                f.write(b"L" * BIG)
                f.write(b"\nafter the long line \xff\n")
            await until_async(lambda: "after the long line \ufffd" in lines, 60, "the line after 10 MB")
            assert any(ln.endswith(" …") and len(ln) == MAX_LINE + 2 for ln in lines)
            tail = await s.read_log_tail(3)  # `logs -n 3`: bounded too
            assert tail[-1] == "after the long line \ufffd" and all(len(x) <= MAX_LINE + 2 for x in tail)
            log.write_bytes(b"after truncation\n")  # truncated, then written from the start
            await until_async(lambda: "after truncation" in lines, 30, "the truncated log")
            assert "[dflash-console] train.log was truncated: following the new file from its start" in lines
            os.rename(log, run / "train.log.1")  # rotation: a new file under the same name
            (run / "train.log").write_bytes(b"rotated 1\nrotated 2\n")
            await until_async(lambda: "rotated 2" in lines, 30, "the rotated log")
            assert "[dflash-console] train.log was replaced: following the new file from its start" in lines
            assert lines.index("rotated 1") == lines.index("rotated 2") - 1
        finally:
            await s.close()
    assert [r.get("step") for r in records if r.get("kind") == "step"][-1] == 2
    assert not [r for r in caplog.records if "subscriber failed" in r.getMessage()], caplog.text
