"""The operator screen over several runs (console/core/fleet.py): an overview of every run
(console/screens/overview.py) and today's full screen for the run in view.

The full screen is :class:`console.app.ConsoleApp`'s, pointed at one run at a time: ``show_run``
swaps the session, the folded state, the log pane's lines, the target and read-only flag, so every
key acts on the run on screen. Every run's session feeds its own state all the time (the overview
is live), its health rules are evaluated on the same timer and its checkpoints polled on their own.
Every run's records also feed ``compare`` (console/core/compare.py), the curves the compare view
(console/tui/compare_screen.py, ``c`` on the overview) draws.
With one target the CLI opens a plain ConsoleApp instead (nothing changes for one run).
"""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.screen import ModalScreen

from console.app import ConsoleApp
from console.core.checkpoints import CheckpointWatch
from console.core.compare import CompareData
from console.core.events import ConnState, Event, LogLines
from console.core.fleet import Run
from console.core.health import NOTE
from console.core.ssh import HostKeyRefused, backoff
from console.screens.overview import OverviewScreen, back_to_overview, install_overview
from console.screens.stop_dialog import StopDialog
from console.tui.compare_screen import CompareScreen, open_compare


class FleetStopDialog(StopDialog):
    """The stop/restart dialog, naming the host and container above the trainer's PID."""

    def __init__(self, where: str, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.where = where

    def summary_text(self) -> Text:
        t = Text("on ", style="dim")
        t.append(self.where, style="bold")
        t.append("\n")
        t.append(super().summary_text())
        return t


RUN_ACTIONS = {"stop", "restart", "launch", "deploy", "alerts", "checkpoints", "search", "threads"}


def not_on_a_run(app) -> bool:
    """Under any dialog (help...) the overview or the compare view is on screen: the run-changing keys
    have no run to act on."""
    for screen in reversed(app.screen_stack):
        if not isinstance(screen, ModalScreen):
            return screen is app.overview or isinstance(screen, CompareScreen)
    return False


class FleetApp(ConsoleApp):
    BINDINGS = [
        *ConsoleApp.BINDINGS,
        Binding("o", "overview", "Overview", tooltip="back to the overview of every run"),
    ]

    def __init__(self, runs: list[Run], **kw) -> None:
        first = runs[0]
        super().__init__(
            first.session,
            state=first.state,
            readonly=first.readonly,
            target=f"{first.target.title} · {first.target.where}",
            **kw,
        )
        self.runs = runs
        self.current = 0
        self.overview: OverviewScreen | None = None
        self.compare = CompareData(len(runs))  # every run's curves, for the compare view

    @property
    def current_run(self) -> Run:
        return self.runs[self.current]

    # ---- mounting: every run's session, health rules and checkpoint watch --------------------

    def on_mount(self) -> None:
        # Textual calls ConsoleApp.on_mount after this one (handlers run for each class of the MRO):
        # with no session set it starts nothing; show_run() sets the run on screen.
        self.session = None
        hooks = self.health_hooks
        for i, run in enumerate(self.runs):
            if hooks.config is not None:
                run.state.health.config = hooks.config
            if hooks.bundled_key is not None:
                run.state.health.bundled_key = hooks.bundled_key
            run.session.subscribe(lambda ev, i=i: self._run_event(i, ev))
            if hasattr(run.session, "need_helper"):
                run.watch = CheckpointWatch(
                    run.session, lambda info, i=i: self._run_event(i, info), hooks.disk_interval_s
                )
                run.watch.start()
            self._start_run(i)
        self.set_interval(hooks.interval_s * 5, self._health_others)
        self.overview = install_overview(self)
        self.push_screen(self.overview)

    async def on_unmount(self) -> None:
        # (ConsoleApp.on_unmount runs after this one: it unmounts the health hooks)
        self.session = None
        for run in self.runs:
            if run.watch is not None:
                await run.watch.stop()
        await asyncio.gather(*(r.session.close() for r in self.runs), return_exceptions=True)

    @work(exit_on_error=False)
    async def _start_run(self, i: int) -> None:
        """Connect one run; a failure is retried with backoff for this run alone."""
        run = self.runs[i]
        attempt = 0
        while True:
            try:
                await run.session.start()
                return
            except HostKeyRefused as exc:
                self._run_event(i, ConnState("disconnected", str(exc), None))
                self.notify(
                    str(exc), title=f"{run.target.title}: host key refused", severity="error", timeout=60
                )
                return
            except Exception as exc:
                delay = backoff(attempt)
                attempt += 1
                self._run_event(i, ConnState("reconnecting", f"{exc}; retrying", delay))
                await asyncio.sleep(delay)

    # ---- events: each run folds its own; the run in view is drawn -----------------------------

    def _run_event(self, i: int, event: Event) -> None:
        run = self.runs[i]
        run.apply(event)
        self.compare.apply(i, event)
        if i != self.current:
            return
        if isinstance(event, LogLines):
            if self.is_running:
                self.log_view.push(event.lines)
            return
        self.schedule_refresh()

    def on_session_event(self, event: Event) -> None:
        """What the screen itself says (say(), health hooks) goes to the run in view."""
        self._run_event(self.current, event)

    def _health_others(self) -> None:
        """The health rules of the runs not in view (the hooks evaluate the one in view)."""
        for i, run in enumerate(self.runs):
            if i == self.current:
                continue
            for ch in run.state.health.evaluate():
                a = ch.alert
                if ch.kind == "cleared":
                    run.state.note(f"alert cleared: {a.message}")
                else:
                    run.state.note(f"alert {a.level}: {a.message}", "info" if a.level == NOTE else "error")
                    if a.level != NOTE and not a.acked:
                        self.notify(
                            f"{run.target.title}: {a.message}",
                            severity="error" if a.level == "critical" else "warning",
                            timeout=15,
                        )

    # ---- switching --------------------------------------------------------------------------

    def show_run(self, i: int) -> None:
        """Put run ``i`` on the full screen; every key then acts on it."""
        self.current_run.deployed_code_dir = self.deployed_code_dir
        self.current = i
        run = self.current_run
        self.session = run.session
        self.state = run.state
        self.readonly = run.readonly
        self.deployed_code_dir = run.deployed_code_dir
        self.target = f"{run.target.title} · {run.target.where}"
        self.w_conn.target = self.target
        self.w_conn.readonly = self.readonly
        self.health_hooks.watch = run.watch
        lv = self.log_view
        lv._pending.clear()
        lv.clear()
        lv.push(list(run.log_lines))
        if self.screen is self.overview:
            self.pop_screen()
        self.refresh_now(plots=True)
        self.refresh_bindings()

    def action_overview(self) -> None:
        if self.overview is not None:
            back_to_overview(self)

    def open_compare(self, chosen: set[int]) -> None:
        open_compare(self, chosen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in RUN_ACTIONS and self.overview is not None and not_on_a_run(self):
            return False  # on the overview (or the compare view) no run is on screen: open one first
        return super().check_action(action, parameters)

    def push_screen(self, screen, *args, **kwargs):
        if type(screen) is StopDialog:  # name the host and container as well as the PID
            screen = FleetStopDialog(
                self.current_run.target.where,
                screen.kind,
                screen.state,
                screen.runner,
                timeout=screen.timeout,
                clock=screen.clock,
            )
        return super().push_screen(screen, *args, **kwargs)
