"""``dflash-console demo --headless``: no screen; a status line a second until Ctrl-C (or the trainer
ends by itself), then the demo's shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

from console.core.events import Record, TrainerFound
from console.core.formatting import fmt_number
from console.core.metrics import headline_tok_s
from console.core.session import Session
from console.demo.demo import HINT, PLACE, Demo, DemoError, off_signals, on_signals, printer


class StatusLine:
    """Folds session events into ``step, loss, accept_len, tok/s, queue`` (one line; accept_len: the
    trainer's estimate ``accept_len_est``, or an old run's ``accept_len``)."""

    def __init__(self) -> None:
        self.step: dict | None = None
        self.tok_s: float | None = None
        self.queue: dict | None = None
        self.stopped: dict | None = None
        self.trainer_seen = False
        self.trainer_gone = asyncio.Event()

    def on_event(self, ev: object) -> None:
        if isinstance(ev, Record):
            rec = ev.record
            kind = rec.get("kind")
            if kind == "step":
                self.step = rec
            elif kind == "throughput":
                self.tok_s = headline_tok_s(rec)
                q = rec.get("queue")
                self.queue = q if isinstance(q, dict) else None
            elif kind == "event" and rec.get("name") == "stopped":
                self.stopped = rec
        elif isinstance(ev, TrainerFound):
            if ev.trainer is not None:
                self.trainer_seen = True
                self.trainer_gone.clear()
            elif self.trainer_seen:
                self.trainer_gone.set()

    def line(self) -> str | None:
        if self.step is None and self.tok_s is None:
            return None
        s = self.step or {}

        step = f"{s['step']}/{s.get('total_steps', '?')}" if isinstance(s.get("step"), int) else "-"
        tok = fmt_number(self.tok_s, ".0f")
        q = self.queue or {}
        queue = f"{q.get('depth', '?')}/{q.get('capacity', '?')}" if q else "-"
        return f"step {step}  loss {fmt_number(s.get('loss'), '.3f')}  accept_len {fmt_number(s.get('accept_len_est', s.get('accept_len')), '.2f')}  tok/s {tok}  queue {queue}"


async def run_headless(demo: Demo) -> int:
    say = demo.say
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def on_signal(sig: int) -> None:
        if stop.is_set():
            say(f"{signal.Signals(sig).name}: already ending the demo, please wait")
        else:
            say(f"{signal.Signals(sig).name}: ending the demo")
        stop.set()

    on_signals(loop, on_signal, sigs)
    status = StatusLine()
    session: Session | None = None
    setup: asyncio.Task | None = None
    ticker: asyncio.Task | None = None
    ok = True
    t0 = time.monotonic()
    try:
        await demo.start_host()
        say(f"demo host: 127.0.0.1:{demo.host.port}, {PLACE.describe} = {demo.ct_dir}")
        say(f"{HINT} {demo.cli_hint()}")
        session = demo.session(telemetry=False)
        session.subscribe(status.on_event)
        await session.start()
        setup = loop.create_task(demo.setup(session, say))

        async def tick() -> None:
            while True:
                await asyncio.sleep(1.0)
                line = status.line()
                if line is not None:
                    m, s = divmod(int(time.monotonic() - t0), 60)
                    say(f"[{m:02d}:{s:02d}] {line}")

        ticker = loop.create_task(tick())
        waits = [loop.create_task(stop.wait()), loop.create_task(status.trainer_gone.wait()), setup]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            if t is not setup:
                t.cancel()
        if setup in done and setup.exception() is not None:
            exc = setup.exception()
            printer(sys.stderr)(f"dflash-console demo: setup failed: {exc}")
            ok = False
        elif setup in done and not stop.is_set():
            # set up: now wait for a signal or for the trainer to end by itself
            gone = loop.create_task(status.trainer_gone.wait())
            halt = loop.create_task(stop.wait())
            await asyncio.wait([gone, halt], return_when=asyncio.FIRST_COMPLETED)
            gone.cancel()
            halt.cancel()
        if status.trainer_gone.is_set() and not stop.is_set():
            st = status.stopped or {}
            say(
                f"the trainer ended by itself ({st.get('reason', 'no stopped event')}, "
                f"exit code {st.get('exit_code', '?')}); ending the demo"
            )
            ok = ok and st.get("exit_code") == 0
    except DemoError as e:
        printer(sys.stderr)(f"dflash-console demo: {e}")
        ok = False
    except Exception as e:  # said, not a traceback; the shutdown below still runs
        printer(sys.stderr)(f"dflash-console demo: {type(e).__name__}: {e}")
        ok = False
    finally:
        for t in (setup, ticker):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        run_dir = session.run_dir if session is not None else None
        if session is not None:
            await session.close()
        clean = await demo.shutdown(run_dir, say)
        off_signals(loop, sigs)
    say("demo ended; nothing of it is left running" if clean else "demo ended (see the messages above)")
    return 0 if ok and clean else 1
