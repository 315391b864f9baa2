"""The operator screen: a Textual app over a session (console.core.session_protocol.ScreenSession,
which console.core.session.Session is).

Session events are folded into :class:`console.core.state.ConsoleState` (the view model) and the
widgets read it. Repaints are coalesced: a change schedules one refresh at most every
``min_refresh_s`` (plots every ``plot_refresh_s``), and log lines are batched by the log widget, so
a flood of events costs a bounded amount of screen work. Quitting closes the connection only; it
never touches the trainer.

A program built on this screen (the demo, console/demo/) changes it through an :class:`Extension`,
not a subclass: a title, the quit key's wording, a start-up coroutine whose messages go to the log
pane, a coroutine the first quit awaits (the demo stops its trainer there) and signal handlers.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from console.core.events import ConnState, Event, LogLines, TrainerFound
from console.core.session_protocol import ScreenSession
from console.core.ssh import HostKeyRefused, backoff
from console.core.state import ConsoleState
from console.screens.alerts import AlertsScreen
from console.screens.checkpoints_dialog import CheckpointsScreen, CopyJobs
from console.screens.health_hooks import HealthHooks
from console.screens.help import LOG_KEYS, PALETTE_KEY, QUIT_NOTE, HelpScreen, binding_rows
from console.screens.launch_dialog import LaunchDialog, submitted_as
from console.screens.launch_dialog import describe as describe_launch
from console.screens.palette import ConsoleCommands
from console.screens.restart_dialog import RestartDialog
from console.screens.stop_dialog import StopDialog
from console.screens.threads import ThreadsScreen
from console.widgets.accept_plot import AcceptPlot
from console.widgets.connection_bar import ConnectionBar
from console.widgets.gpu_table import GpuTable
from console.widgets.log_view import LogPane
from console.widgets.loss_plot import LossPlot
from console.widgets.queue_gauge import QueueGauge
from console.widgets.toast_text import TOAST_CSS, break_paths, toast_columns
from console.widgets.tok_s_plot import TokSPlot
from console.widgets.training_panel import TrainingPanel


@dataclass(frozen=True)
class Action:
    name: str
    key: str
    label: str  # footer
    title: str  # palette
    help: str
    changes_remote: bool


ACTIONS = [
    Action(
        "stop",
        "s",
        "Stop",
        "Stop the trainer cleanly",
        "SIGINT: it saves a checkpoint and exits (asks first)",
        True,
    ),
    Action(
        "restart",
        "r",
        "Restart",
        "Restart the trainer",
        "stop cleanly, then launch the same run with --resume auto (asks first)",
        True,
    ),
    Action("launch", "l", "Launch", "Launch the trainer", "flags prefilled from the last run.json", True),
    Action(
        "deploy",
        "d",
        "Deploy",
        "Deploy the bundled trainer",
        "into a new versioned code directory; a running trainer is not touched",
        True,
    ),
    Action(
        "alerts",
        "a",
        "Alerts",
        "Show alerts",
        "active and past alerts; Enter acknowledges one (silent until it clears)",
        False,
    ),
    Action(
        "checkpoints",
        "c",
        "Checkpoints",
        "Checkpoints and disk",
        "the run's checkpoints, free space, keep-count; y copies a drafter to this machine",
        False,
    ),
    Action(
        "threads",
        "t",
        "Threads",
        "Threads of the trainer",
        "processes and threads: CPU%, state, live; p: py-spy dump",
        False,
    ),
    Action("search", "slash", "Search", "Search the log", "highlight and jump to matches", False),
    Action("help", "question_mark", "Help", "Help", "every key", False),
    Action("quit", "q", "Quit", "Quit the console", "the trainer keeps running", False),
]
CHANGING = {a.name for a in ACTIONS if a.changes_remote}


@dataclass
class Extension:
    """What a program built on the operator screen adds to it (the demo: console/demo/screen.py).

    The coroutines get the app: ``app.say(text)`` writes to the log pane (each line after
    ``log_prefix``), ``app.session``, ``app.notify``, ``app.exit`` are there for them.
    """

    title: str | None = None  # the app's title
    quit_label: str | None = None  # the quit key's footer label ...
    quit_title: str | None = None  # ... its title in help and the palette ...
    quit_help: str | None = None  # ... and what it does
    quit_note: str = QUIT_NOTE  # the help screen's last line
    log_prefix: str = ""
    # Run once the screen is up (a worker; a quit cancels it).
    startup: Callable[[ConsoleApp], Awaitable[None]] | None = None
    # The first quit (q, ctrl+q) awaits this, then the app exits; a second quit leaves at once.
    before_quit: Callable[[ConsoleApp], Awaitable[None]] | None = None
    # Signal handlers, installed while the screen is mounted (they run in the app's context).
    signals: Mapping[signal.Signals, Callable[[ConsoleApp, signal.Signals], None]] = field(
        default_factory=dict
    )


def empty_log_hint(run_dir: str | None) -> str:
    """What the log pane says while it is empty: where the console reads the trainer's log."""
    if not run_dir:
        return "(no run directory known: the console reads RUN_DIR/train.log; give --run-dir)"
    return f"(no train.log yet: a trainer keeping docs/run-directory.md writes it in {run_dir})"


class ConsoleApp(App):
    """``session`` may be None: the screen then shows only what is fed into ``state``
    (snapshots, benches); the changing actions then say there is no connection."""

    TITLE = "dflash-console"
    CSS = (
        """
    Screen { layout: vertical; }
    #top { height: 13; }
    #left { width: 1fr; height: 100%; }
    TrainingPanel { width: 54; padding: 0 1; border-left: solid $primary-darken-2; }
    QueueGauge { margin: 0 1; }
    #plots { height: 10; }
    """
        + TOAST_CSS
    )
    BINDINGS = [Binding(a.key, a.name, a.label, tooltip=a.help) for a in ACTIONS]
    COMMANDS = App.COMMANDS | {ConsoleCommands}

    def __init__(
        self,
        session: ScreenSession | None = None,
        *,
        extension: Extension | None = None,
        state: ConsoleState | None = None,
        readonly: bool = False,
        target: str = "",
        clock: Callable[[], float] = time.time,
        stop_timeout: float = 120.0,
        log_max_lines: int = 5000,
        min_refresh_s: float = 0.05,
        plot_refresh_s: float = 1.0,
        tick_s: float = 1.0,
        health: HealthHooks | None = None,
    ) -> None:
        super().__init__()
        self.extension = ext = extension or Extension()
        self.actions = [
            replace(
                a,
                label=ext.quit_label or a.label,
                title=ext.quit_title or a.title,
                help=ext.quit_help or a.help,
            )
            if a.name == "quit"
            else a
            for a in ACTIONS
        ]
        if ext.title is not None:
            self.title = ext.title
        if ext.quit_label or ext.quit_help:  # this instance's quit key says what it does here
            q = next(a for a in self.actions if a.name == "quit")
            self._bindings.key_to_bindings[q.key] = [Binding(q.key, q.name, q.label, tooltip=q.help)]
        self.quitting = False  # a quit has begun (what is said from then on is kept in ``after``)
        self.after: list[str] = []  # what was said while quitting: to print again once the screen is gone
        self.session = session
        self.readonly = readonly or (session is not None and session.readonly)
        self.state = state if state is not None else ConsoleState(clock=clock)
        self.target = target
        self.stop_timeout = stop_timeout
        self.min_refresh_s = min_refresh_s
        self.plot_refresh_s = plot_refresh_s
        self.tick_s = tick_s
        self.log_max_lines = log_max_lines
        self.deployed_code_dir: str | None = None  # set by a deploy from this screen; launch/restart use it
        self._refresh_handle: asyncio.TimerHandle | None = None
        self._plot_handle: asyncio.TimerHandle | None = None
        self._last_refresh = 0.0
        self._last_plot = 0.0
        self._drawn_version = -1
        self.refreshes = 0
        self.health_hooks = health or HealthHooks()
        self.copy_jobs = CopyJobs()

    # ---- layout -------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        self.w_conn = ConnectionBar(self.target, self.readonly, id="conn")
        self.w_gpus = GpuTable(id="gpus")
        self.w_queue = QueueGauge(id="queue")
        self.w_training = TrainingPanel(id="training")
        self.w_toks = TokSPlot(id="toks")
        self.w_loss = LossPlot(id="loss")
        self.w_accept = AcceptPlot(id="accept")
        self.w_log = LogPane(max_lines=self.log_max_lines, id="logpane")
        yield self.w_conn
        with Horizontal(id="top"):
            with Vertical(id="left"):
                yield self.w_gpus
                yield self.w_queue
            yield self.w_training
        with Horizontal(id="plots"):
            yield self.w_toks
            yield self.w_loss
            yield self.w_accept
        yield self.w_log
        yield Footer()

    @property
    def log_view(self):
        return self.w_log.view

    def on_mount(self) -> None:
        loop = asyncio.get_running_loop()
        for sig, handler in self.extension.signals.items():
            loop.add_signal_handler(sig, handler, self, sig)
        if self.extension.startup is not None:
            self._startup()
        self.log_view.focus()
        self.refresh_now(plots=True)
        self.set_interval(self.tick_s, self._tick)
        self.health_hooks.mount(self)
        if self.session is not None:
            self.session.subscribe(self.on_session_event)
            self._start_session()

    @work(group="session", exit_on_error=False)
    async def _start_session(self) -> None:
        """Connect; a first connection that fails is retried with the session's capped backoff
        (after that the session reconnects by itself). A refused host key is not retried."""
        attempt = 0
        while True:
            try:
                await self.session.start()
                return
            except HostKeyRefused as exc:
                self.notify(str(exc), title="host key refused", severity="error", timeout=60)
                return
            except Exception as exc:
                delay = backoff(attempt)
                attempt += 1
                self.on_session_event(ConnState("reconnecting", f"{exc}; retrying", delay))
                await asyncio.sleep(delay)

    async def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.extension.signals:
            loop.remove_signal_handler(sig)
        await self.health_hooks.unmount()
        if self.session is not None:
            await self.session.close()

    def notify(self, message: str, *args, **kwargs) -> None:
        """A toast, its paths broken at slashes (console/widgets/toast_text.py), never mid-name."""
        super().notify(break_paths(message, toast_columns(self.size.width)), *args, **kwargs)

    # ---- extension: start-up, saying things, quitting -----------------------------------------

    @work(group="startup", exit_on_error=False)
    async def _startup(self) -> None:
        await self.extension.startup(self)

    def cancel_startup(self) -> None:
        self.workers.cancel_group(self, "startup")

    def say(self, text: str) -> None:
        """Lines of the screen's own in the log pane (after the extension's ``log_prefix``); while
        quitting they are kept in ``after`` too."""
        if self.quitting:
            self.after.append(text)
        self.on_session_event(LogLines([f"{self.extension.log_prefix}{line}" for line in text.splitlines()]))

    async def action_quit(self) -> None:
        if self.extension.before_quit is None or self.quitting:
            self.exit()  # (asked twice: leave now)
            return
        self.quitting = True
        self._quit()

    @work(group="quit", exit_on_error=False)
    async def _quit(self) -> None:
        self.cancel_startup()
        try:
            await self.extension.before_quit(self)
        finally:
            self.exit()

    # ---- events -> state -> widgets -----------------------------------------------------------

    def on_session_event(self, event: Event) -> None:
        """The session's subscriber (called on the event loop)."""
        if isinstance(event, LogLines):
            if self.is_running:
                self.log_view.push(event.lines)
            return
        if isinstance(event, TrainerFound) and event.trainer is not None and self.is_running:
            self.log_view.set_empty_hint(empty_log_hint(event.trainer.run_dir))
        self.state.apply(event)
        self.schedule_refresh()

    def feed(self, events) -> None:
        """Apply events as if the session had sent them (replay, benches)."""
        for ev in events:
            self.on_session_event(ev)

    def schedule_refresh(self) -> None:
        if self._refresh_handle is not None or not self.is_running:
            return
        delay = max(0.0, self._last_refresh + self.min_refresh_s - time.monotonic())
        self._refresh_handle = asyncio.get_running_loop().call_later(delay, self._scheduled_refresh)

    def _scheduled_refresh(self) -> None:
        self._refresh_handle = None
        self.refresh_now()

    def refresh_now(self, plots: bool = False) -> None:
        """Push the state into the widgets (plots at most every plot_refresh_s unless asked)."""
        now = time.monotonic()
        self._last_refresh = now
        if not self.is_running or not self.w_conn.is_mounted:
            return
        st = self.state
        self.refreshes += 1
        self._drawn_version = st.version
        self.w_conn.update_from(st)
        self.w_gpus.update_from(st)
        self.w_queue.update_from(st)
        self.w_training.update_from(st)
        if plots or now - self._last_plot >= self.plot_refresh_s:
            self._refresh_plots()
        elif self._plot_handle is None:  # plots skipped this time: come back for them
            delay = self._last_plot + self.plot_refresh_s - now
            self._plot_handle = asyncio.get_running_loop().call_later(delay, self._refresh_plots)

    def _refresh_plots(self) -> None:
        self._plot_handle = None
        self._last_plot = time.monotonic()
        if self.is_running and self.w_toks.is_mounted:
            self.w_toks.update_from(self.state)
            self.w_loss.update_from(self.state)
            self.w_accept.update_from(self.state)

    def _tick(self) -> None:
        """Ages and countdowns move with the clock even when no data arrives."""
        if self.w_conn.is_mounted:
            self.w_conn.update_from(self.state)
            self.w_training.update_from(self.state)

    # ---- actions ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # read-only: the changing actions are hidden from the footer and never run
        return not (self.readonly and action in CHANGING)

    def get_system_commands(self, screen):
        """Textual's own palette entries (theme, keys, screenshot...) less its Quit: the console's quit,
        with this screen's wording (the demo's stops the trainer first), is among ``palette_commands``."""
        for command in super().get_system_commands(screen):
            if command.callback != self.action_quit:
                yield command

    def palette_commands(self) -> list[tuple[str, str, str]]:
        return [(a.name, a.title, a.help) for a in self.actions if not (self.readonly and a.changes_remote)]

    def help_rows(self) -> list[tuple[str, str, str]]:
        """The keys of the screen under help, from its live bindings (console/screens/help.py)."""
        screen = next(s for s in reversed(self.screen_stack) if not isinstance(s, HelpScreen))
        return binding_rows(screen, {a.name: (a.title, a.help) for a in self.actions})

    def _need_session(self) -> bool:
        if self.session is None:
            self.notify("not connected to a host", severity="warning")
            return False
        return True

    def action_stop(self) -> None:
        self._control("stop")

    def action_restart(self) -> None:
        """One meaning, as the CLI's ``restart``: stop cleanly (when a trainer runs), then launch run.json's
        command with --resume auto; the dialog shows what it will run first (console/screens/restart_dialog.py)."""
        if self.readonly or isinstance(self.screen, StopDialog) or not self._need_session():
            return
        self._plan_restart()

    @work(exclusive=True, group="restart-plan", exit_on_error=False)
    async def _plan_restart(self) -> None:
        try:  # the CLI's planner: it runs the last deployment (this screen's `d` or the CLI's deploy)
            plan, concerns, _trainer = await self.session.plan_restart()
        except Exception as exc:  # noqa: BLE001 - said, the screen goes on (no run.json, not connected)
            self.notify(f"cannot restart: {exc}", severity="warning", timeout=10)
            return
        if isinstance(self.screen, StopDialog):
            return
        runner = functools.partial(self.session.restart_trainer, shown=plan)
        self.push_screen(RestartDialog(self.state, runner, plan, concerns, timeout=self.stop_timeout))

    def _control(self, kind: str) -> None:
        if self.readonly:
            return
        if self.state.trainer is None:
            self.notify("no trainer is running", severity="warning")
            return
        if isinstance(self.screen, StopDialog):
            return
        runner = None
        if self.session is not None:
            runner = self.session.stop_trainer
            if kind == "restart":  # the one planner picks the code (the last deployment)
                runner = self.session.restart_trainer
        else:

            async def runner(**_):
                raise RuntimeError("not connected to a host")

        self.push_screen(StopDialog(kind, self.state, runner, timeout=self.stop_timeout))

    def action_launch(self) -> None:
        if self.readonly or not self._need_session():
            return
        live = self.state.trainer.pid if self.state.trainer is not None else None
        # no trainer seen: the run directory's run.json as the session last read it (a run that has ended)
        run = self.state.run or getattr(self.session, "run", None)
        self.push_screen(
            LaunchDialog(
                run,
                self.session.launch,
                live_pid=live,
                code_dir=self.deployed_code_dir,
                submitted_as=submitted_as(self.session.place),
                vet=getattr(self.session, "prefill_concerns", None),  # test fakes may lack it
                serve=getattr(self.session, "serve", None),
            ),
            callback=self._launched,
        )

    def _launched(self, result: object) -> None:
        """The launch dialog closes on success: say what started (events and a toast)."""
        ok, text = describe_launch(result)
        if result is None or not ok:
            return
        self.state.note(text)
        for line in getattr(getattr(result, "serve_check", None), "warnings", ()):  # said, never blocking
            self.state.note(f"serve check: {line}", "warn")
        self.schedule_refresh()
        self.notify(text, title="trainer launched", timeout=10)

    def action_deploy(self) -> None:
        if self.readonly or not self._need_session():
            return
        self._deploy()

    @work(exclusive=True, group="deploy", exit_on_error=False)
    async def _deploy(self) -> None:
        self.notify("deploying the bundled trainer…", timeout=3)
        try:
            where = await self.session.deploy()
        except Exception as exc:
            self.state.note(f"deploy failed: {exc}", "error")
            self.schedule_refresh()
            self.notify(f"deploy failed: {exc}", severity="error", timeout=15)
            return
        self.deployed_code_dir = where
        self.state.note(f"deployed to {where}")
        self.schedule_refresh()
        self.notify(f"deployed to {where}; a launch or restart uses it", timeout=10)

    def action_alerts(self) -> None:
        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen(self.state.health, self.state.clock))

    def action_checkpoints(self) -> None:
        if not isinstance(self.screen, CheckpointsScreen):
            if self.health_hooks.watch is not None:
                self.health_hooks.watch.poke()  # look again now
            self.push_screen(CheckpointsScreen(self.state, self.copy_jobs, self.state.clock))

    def action_threads(self) -> None:
        if isinstance(self.screen, ThreadsScreen):
            return
        if getattr(self.session, "sample_threads", None) is None:
            self.notify("the threads view needs a live connection to the host", severity="warning")
            return
        self.push_screen(ThreadsScreen(self.session))

    def action_search(self) -> None:
        self.w_log.open_search()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        extra = [*LOG_KEYS, PALETTE_KEY] if self.screen is self.screen_stack[0] else [PALETTE_KEY]
        rows = self.help_rows()
        self.push_screen(HelpScreen(rows, self.readonly, quit_note=self.extension.quit_note, extra=extra))
