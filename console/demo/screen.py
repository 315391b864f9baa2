"""The demo's screen: the ordinary operator screen (console/app.py) plus the demo's own setup and quit.

It is the ordinary :class:`~console.app.ConsoleApp` on a Session to the demo's host, given an
:class:`~console.app.Extension` (no subclass, no Textual here). On mount it runs the demo's setup
(tiny target, deploy, launch) and shows its progress in the log pane; in the demo ``q`` ends the
demo: it stops the trainer cleanly first (its phases in the log), then quits. A second ``q`` quits at
once; :func:`run_screen` stops the trainer after the screen closes anyway.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING

from console.core.events import ActionPhase
from console.core.session import Session
from console.demo.demo import HINT, Demo, DemoError, off_signals, on_signals, printer

if TYPE_CHECKING:
    from console.app import ConsoleApp

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
QUIT_HELP = "stop the trainer cleanly (checkpoint), end the demo"


class DemoScreen:
    """What the demo adds to the operator screen; :meth:`app` builds the screen with it."""

    def __init__(self, demo: Demo, session: Session) -> None:
        self.demo = demo
        self.session = session
        self.setup_error: str | None = None
        self.clean: bool | None = None  # set when a signal ended the demo from inside the screen
        self._signal_task: asyncio.Task | None = None

    def app(self, **kw) -> ConsoleApp:
        from console.app import ConsoleApp, Extension  # the screen only (--headless never loads Textual)

        ext = Extension(
            title="dflash-console demo",
            quit_label="Quit demo",
            quit_title="Quit the demo",
            quit_help=QUIT_HELP,
            quit_note=f"In the demo, q: {QUIT_HELP}.",
            log_prefix="[demo] ",
            startup=self._setup,
            before_quit=self._stop_trainer,
            signals=dict.fromkeys(SIGNALS, self._end_on_signal),
        )
        return ConsoleApp(self.session, target=self.demo.target, extension=ext, **kw)

    async def _setup(self, app: ConsoleApp) -> None:
        app.say(f"container {self.demo.ct_dir}; run dir {self.demo.run_dir}")
        app.say(f"{HINT} {self.demo.cli_hint()}")
        try:
            await self.demo.setup(self.session, app.say)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.setup_error = str(exc)
            app.say(f"setup failed: {exc}")
            app.notify(str(exc).splitlines()[0], title="demo setup failed", severity="error", timeout=60)
            return
        app.notify("the tiny trainer is running: watch the loss fall and accept len rise", timeout=8)

    async def _stop_trainer(self, app: ConsoleApp) -> None:
        """The first ``q``: stop the trainer cleanly (its phases in the log), then the app exits."""
        session = self.session
        if session.connected and session.trainer is not None:
            app.notify(
                "ending the demo: stopping the trainer cleanly (checkpoint, exit); q again: quit now",
                timeout=30,
            )

            def phase(p: ActionPhase) -> None:
                app.say(f"  [{p.phase}] {p.detail}")

            try:
                res = await session.stop_trainer(timeout=90, on_phase=phase)
                app.say(res.message)
            except Exception as exc:  # the demo's shutdown after the screen retries
                app.say(f"stop failed: {exc}")

    def _end_on_signal(self, app: ConsoleApp, sig: signal.Signals) -> None:
        """SIGINT/SIGTERM/SIGHUP: end the demo (trainer stopped, host closed) while the screen still
        runs, then leave. After SIGHUP the terminal is gone and Textual's restore of it can block, so
        the process exits at once."""
        if self._signal_task is not None:
            return
        self._signal_task = asyncio.get_running_loop().create_task(self._end(app, sig))

    async def _end(self, app: ConsoleApp, sig: signal.Signals) -> None:
        app.quitting = True
        app.say(f"{signal.Signals(sig).name}: ending the demo")
        app.cancel_startup()
        self.clean = await self.demo.shutdown(self.session.run_dir, app.say)
        if sig == signal.SIGHUP:
            self.demo.release_dir()
            os._exit(0 if self.clean else 1)
        app.exit()


def demo_app(demo: Demo, session: Session, **kw) -> ConsoleApp:
    """The operator screen with the demo's additions (what ``dflash-console demo`` shows)."""
    return DemoScreen(demo, session).app(**kw)


async def run_screen(demo: Demo) -> int:
    loop = asyncio.get_running_loop()
    screen: DemoScreen | None = None
    app: ConsoleApp | None = None
    try:
        await demo.start_host()
        screen = DemoScreen(demo, demo.session())
        app = screen.app()  # it takes SIGINT/SIGTERM/SIGHUP once mounted
        await app.run_async()
    except DemoError as e:
        printer(sys.stderr)(f"dflash-console demo: {e}")
        return_code = 1
    else:
        return_code = 0 if screen.setup_error is None else 1
        if screen.setup_error is not None:
            printer(sys.stderr)(f"dflash-console demo: setup failed: {screen.setup_error}")
    finally:
        # Signals now mean "hurry": the shutdown below is what they would have asked for.
        on_signals(loop, lambda sig: demo.say("already ending the demo, please wait"), SIGNALS)
        run_dir = screen.session.run_dir if screen is not None else None
        for line in app.after if app is not None else []:
            demo.say(line)
        demo.say("ending the demo: closing the host, ending what it started")
        clean = await demo.shutdown(run_dir, demo.say)
        if screen is not None and screen.clean is not None:
            clean = clean and screen.clean
        off_signals(loop, SIGNALS)
    demo.say("demo ended; nothing of it is left running" if clean else "demo ended (see the messages above)")
    return return_code if clean else 1
