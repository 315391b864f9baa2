"""The demo's screen: the operator screen (console/app.py) plus the demo's own setup and quit.

It is the ordinary :class:`~console.app.ConsoleApp` on a Session to the demo's host. On mount it
runs the demo's setup (tiny target, deploy, launch) and shows its progress in the log pane; in the
demo ``q`` ends the demo: it stops the trainer cleanly first (its phases in the log), then quits.
A second ``q`` quits at once; console/demo.py stops the trainer after the screen closes anyway.
"""

from __future__ import annotations

import asyncio
import os
import signal

from textual import work
from textual.binding import Binding

from console.app import ConsoleApp
from console.core.events import ActionPhase, LogLines
from console.screens.help import HelpScreen

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
QUIT_HELP = "stop the trainer cleanly (checkpoint), end the demo"


class DemoApp(ConsoleApp):
    TITLE = "dflash-console demo"
    BINDINGS = [Binding("q", "quit", "Quit demo", tooltip=QUIT_HELP)]

    def __init__(self, demo, session, **kw) -> None:
        super().__init__(session, target=demo.target, **kw)
        self.demo = demo
        self.setup_error: str | None = None
        self.after: list[str] = []  # what the ending said, printed again after the screen is gone
        self.ending = False
        self.clean: bool | None = None  # set when a signal ended the demo from inside the screen
        self._signal_task: asyncio.Task | None = None

    def on_mount(self) -> None:  # ConsoleApp.on_mount runs too (Textual calls each class's handler)
        # Installed here so that the handlers run in the app's context (Textual's context variables).
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self.end_on_signal, sig)
        self._setup()

    def on_unmount(self) -> None:  # (ConsoleApp.on_unmount closes the session)
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)

    def say(self, msg: str) -> None:
        """A demo message, in the log pane (the screen's own log) as ``[demo] ...`` lines."""
        self.on_session_event(LogLines([f"[demo] {line}" for line in msg.splitlines()]))

    @work(group="demo-setup", exit_on_error=False)
    async def _setup(self) -> None:
        self.say(f"container {self.demo.ct_dir}; run dir {self.demo.run_dir}")
        self.say(f"from another terminal: {self.demo.cli_hint()}")
        try:
            await self.demo.setup(self.session, self.say)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.setup_error = str(exc)
            self.say(f"setup failed: {exc}")
            self.notify(str(exc).splitlines()[0], title="demo setup failed", severity="error", timeout=60)
            return
        self.notify("the tiny trainer is running: watch the loss fall and accept len rise", timeout=8)

    def _ending_say(self, msg: str) -> None:
        self.after.append(msg)
        self.say(msg)

    def help_rows(self) -> list[tuple[str, str, str]]:
        return [(k, "Quit the demo", QUIT_HELP) if k == "q" else (k, t, h) for k, t, h in super().help_rows()]

    def palette_commands(self) -> list[tuple[str, str, str]]:
        return [
            (n, "Quit the demo", QUIT_HELP) if n == "quit" else (n, t, h)
            for n, t, h in super().palette_commands()
        ]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(
                HelpScreen(self.help_rows(), self.readonly, quit_note=f"In the demo, q: {QUIT_HELP}.")
            )

    async def action_quit(self) -> None:
        if self.ending:
            self.exit()  # asked twice: leave now; the demo still stops the trainer after the screen closes
            return
        self.ending = True
        self._end()

    @work(group="demo-end", exit_on_error=False)
    async def _end(self) -> None:
        self.workers.cancel_group(self, "demo-setup")
        session = self.session
        if session.connected and session.trainer is not None:
            self.notify(
                "ending the demo: stopping the trainer cleanly (checkpoint, exit); q again: quit now",
                timeout=30,
            )

            def phase(p: ActionPhase) -> None:
                self._ending_say(f"  [{p.phase}] {p.detail}")

            try:
                res = await session.stop_trainer(timeout=90, on_phase=phase)
                self._ending_say(res.message)
            except Exception as exc:  # the demo's shutdown after the screen retries
                self._ending_say(f"stop failed: {exc}")
        self.exit()

    def end_on_signal(self, sig: int) -> None:
        """SIGINT/SIGTERM/SIGHUP: end the demo (trainer stopped, host closed) while the screen still
        runs, then leave. After SIGHUP the terminal is gone and Textual's restore of it can block, so
        the process exits at once."""
        if self._signal_task is not None:
            return
        self._signal_task = asyncio.get_running_loop().create_task(self._end_on_signal(sig))

    async def _end_on_signal(self, sig: int) -> None:
        self.ending = True
        self._ending_say(f"{signal.Signals(sig).name}: ending the demo")
        self.workers.cancel_group(self, "demo-setup")
        self.clean = await self.demo.shutdown(self.session.run_dir, self._ending_say)
        if sig == signal.SIGHUP:
            self.demo.release_dir()
            os._exit(0 if self.clean else 1)
        self.exit()
