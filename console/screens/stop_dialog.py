"""Stop / restart: a guarded confirmation, then a countdown through the stop phases.

The dialog shows which process it is about to signal (PID, command line), the step and the age of
the last checkpoint. "No" is focused; ``y`` confirms, ``n`` or Escape cancels. After confirming it
follows the session's phases (verifying, signal sent, saving with the expected seconds, saved,
exited; every phase the trainer reported, "not seen" only for one that never came; a dropped link and
its return) and, at the timeout, says what to do: the trainer is left running, never killed. The title
and the trainer's lines follow what happened (``Trainer stopped``, the PID marked exited, a restart's
new PID; the step and the checkpoint's age live), never the words of the moment it opened.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from console.core.events import ActionPhase, ActionResult, Outcome, TrainerInfo
from console.core.formatting import fmt_duration
from console.core.phases import FAILED, STOP_STEPS, StopPhase
from console.core.state import ConsoleState

# the checklist's wording of each of the stop's steps (console/core/phases.py: STOP_STEPS, in order)
LABELS: dict[StopPhase, str] = {
    StopPhase.VERIFYING: "check PID is still the trainer",
    StopPhase.SIGNAL_SENT: "SIGINT sent",
    StopPhase.SAVING: "saving checkpoint",
    StopPhase.SAVED: "checkpoint saved",
    StopPhase.EXITED: "trainer exited",
}

Runner = Callable[..., Awaitable[ActionResult]]  # (timeout=..., on_phase=...) -> ActionResult


def app_action(app, key: str) -> str | None:
    """The action the app binds ``key`` to (its own BINDINGS), if any."""
    for binding in Binding.make_bindings(getattr(app, "BINDINGS", [])):
        if binding.key == key:
            return binding.action
    return None


def trainer_summary(
    state: ConsoleState, was: TrainerInfo | None = None, started: TrainerInfo | None = None
) -> Text:
    """The trainer now (its PID, command, step, checkpoint age). ``was``: the one the dialog opened on,
    marked exited once it has gone; ``started``: the one a restart launched (before the session sees it),
    marked as new."""
    tr = state.trainer or started or was
    t = Text()
    if tr is None:
        t.append("no trainer found", style="bold red")
        return t
    t.append("PID ", style="dim")
    t.append(str(tr.pid), style="bold")
    if state.trainer is None and tr is was:
        t.append(" (exited)", style="bold yellow")
    elif was is not None and tr.pid != was.pid:
        t.append(f" (new; was PID {was.pid})", style="bold green")
    elif was is None and started is not None:
        t.append(" (launched)", style="bold green")
    t.append(f"   found by {tr.source}", style="dim")
    if tr.run_dir:
        t.append(f"   run dir {tr.run_dir}", style="dim")
    t.append("\ncommand ", style="dim")
    t.append(shlex.join(tr.cmdline) if tr.cmdline else "?")  # in full: it wraps (the dialog scrolls)
    t.append("\nstep ", style="dim")
    t.append("-" if state.step is None else f"{state.step:,}", style="bold")
    if state.total_steps:
        t.append(f" / {state.total_steps:,}")
    t.append("    last checkpoint ", style="dim")
    age = state.checkpoint_age_s()
    if age is None and tr.source != "run.json" and state.step is None:  # the user's own script, say
        t.append(
            "none seen: this trainer writes no records the console reads; whether SIGINT saves is its own"
        )
    elif age is None:
        t.append("none yet (a stop writes one)", style="yellow")
    else:
        t.append(f"{fmt_duration(age)} ago", style="bold")
        t.append(f" (step {state.ckpt_step})", style="dim")
    return t


class StopDialog(ModalScreen[object]):
    """``kind`` is "stop" or "restart"; ``runner`` is the session's stop_trainer/restart_trainer."""

    BINDINGS = [
        Binding("y", "confirm", "Yes", show=False),
        Binding("n", "cancel", "No", show=False),
        Binding("escape", "cancel", "Cancel / close", show=False),
    ]
    DEFAULT_CSS = """
    StopDialog { align: center middle; }
    StopDialog > Vertical {
        width: 96; height: auto; max-height: 90%; padding: 1 2; overflow-y: auto;
        border: thick $warning; background: $surface;
    }
    StopDialog #title { text-style: bold; margin-bottom: 1; }
    StopDialog #summary { margin-bottom: 1; }
    StopDialog #phases { margin-bottom: 1; }
    StopDialog #buttons { height: 3; align-horizontal: right; }
    StopDialog Button { margin-left: 2; }
    StopDialog.running #buttons { display: none; }
    StopDialog #phases, StopDialog #outcome { display: none; }
    StopDialog.running #phases, StopDialog.running #outcome { display: block; }
    """

    def __init__(
        self,
        kind: str,
        state: ConsoleState,
        runner: Runner,
        *,
        timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.state = state
        self.runner = runner
        self.timeout = timeout
        self.clock = clock
        self.phases: dict[StopPhase, ActionPhase] = {}  # a step or a failure -> its ActionPhase
        self.arrived: dict[StopPhase, float] = {}  # ... -> clock() when it arrived
        self.extra: list[ActionPhase] = []  # other phases (a restart's launch, a dropped link, ...)
        self.started_at: float | None = None
        self.result: ActionResult | Exception | None = None
        self.done = False
        self.was = state.trainer  # the trainer the dialog opened on

    def compose(self) -> ComposeResult:
        verb = "Stop" if self.kind == "stop" else "Restart"
        with Vertical():
            yield Static(self.title_text(), id="title")
            yield Static(self.summary_text(), id="summary")
            yield Static(self._explain(), id="explain")
            yield Static("", id="phases")
            yield Static("", id="outcome")
            with Horizontal(id="buttons"):
                yield Button("No (n)", id="no", variant="primary")
                yield Button(f"Yes, {verb.lower()} (y)", id="yes", variant="error")

    def _explain(self) -> Text:
        t = Text("It gets SIGINT, writes a checkpoint and exits; nothing is killed.", style="dim")
        if self.kind == "restart":
            t.append(
                " Then it is launched again with the same interpreter, directory, environment"
                " and flags plus --resume auto.",
                style="dim",
            )
        t.append(f" Gives up waiting after {self.timeout:.0f} s.", style="dim")
        return t

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()
        self.set_interval(0.5, self._show_head)  # the step and the checkpoint's age move on

    def title_text(self) -> str:
        stop = self.kind == "stop"
        if self.started_at is None:
            return "Stop the trainer cleanly?" if stop else "Restart the trainer cleanly?"
        if not self.done:
            return "Stopping the trainer…" if stop else "Restarting the trainer…"
        if self.succeeded():
            return "Trainer stopped" if stop else "Trainer restarted"
        return "The stop did not finish" if stop else "The restart did not finish"

    def summary_text(self) -> Text:
        started = getattr(self.result, "trainer", None) if self.done else None  # a restart's new trainer
        return trainer_summary(self.state, self.was, started if isinstance(started, TrainerInfo) else None)

    def _show_head(self) -> None:
        if self.is_mounted:
            self.query_one("#title", Static).update(self.title_text())
            self.query_one("#summary", Static).update(self.summary_text())

    @on(Button.Pressed, "#no")
    def _no(self) -> None:
        self.action_cancel()

    @on(Button.Pressed, "#yes")
    def _yes(self) -> None:
        self.action_confirm()

    def action_cancel(self) -> None:
        if self.started_at is None or self.done:
            self.dismiss(self.result)

    def on_key(self, event: events.Key) -> None:
        """Once the stop is over, the app's keys work again: the dialog closes and the app runs the
        key's action (a modal screen otherwise keeps every app key from the app, silently)."""
        if not self.done or event.key in {"escape", "y", "n"}:
            return
        action = app_action(self.app, event.key)
        if action is not None:
            event.stop()
            self.dismiss(self.result)  # (off the stack at once: the action sees the screen below)
            self.app.call_later(self.app.run_action, action)

    def action_confirm(self) -> None:
        if self.started_at is not None or self.state.trainer is None:
            return
        self.started_at = self.clock()
        self.add_class("running")
        self.query_one("#explain", Static).display = False
        self._show()
        self.set_interval(0.25, self._show)
        self._run()

    @work(exclusive=True, group="stop")
    async def _run(self) -> None:
        try:
            self.result = await self.runner(timeout=self.timeout, on_phase=self.on_phase)
        except Exception as exc:  # shown, not raised: the screen must survive a failed stop
            self.result = exc
        self.done = True
        self._show()

    def on_phase(self, phase: ActionPhase) -> None:
        name = StopPhase.of(phase.phase)
        if name is not None and (name in LABELS or name in FAILED):
            self.phases[name] = phase
            self.arrived[name] = self.clock()
        else:  # restart's launching/started, a stop's reconnecting/reconnected: one line each, the newest
            self.extra = [p for p in self.extra if p.phase != phase.phase] + [phase]
        self._show()

    # ---- rendering ----------------------------------------------------------------------------

    def _show(self) -> None:
        if not self.is_mounted:
            return
        self._show_head()
        self.query_one("#phases", Static).update(self.phases_text())
        self.query_one("#outcome", Static).update(self.outcome_text())

    def elapsed(self) -> float:
        return 0.0 if self.started_at is None else self.clock() - self.started_at

    def phases_text(self) -> Text:
        t = Text()
        reached = [i for i, name in enumerate(STOP_STEPS) if name in self.phases]
        last = max(reached) if reached else -1
        for i, name in enumerate(STOP_STEPS):
            ph = self.phases.get(name)
            if ph is not None:
                mark, style = "✔ ", "green"
            elif i < last:  # a later phase came without this one (no checkpoint_saved event, ...)
                mark, style = "– ", "dim"
            elif i == last + 1 and not self.done:
                mark, style = "◌ ", "bold yellow"
            else:
                mark, style = "  ", "dim"
            t.append(mark + LABELS[name] + (" (not seen)" if mark == "– " else ""), style=style)
            if name is StopPhase.SAVING and (ph is not None or i == last + 1):
                saved = StopPhase.SAVED in self.phases
                t.append(self._saving_detail(ph), style="dim" if saved else "yellow")
            elif ph is not None and ph.detail:
                t.append(f"  {ph.detail}", style="dim")
            t.append("\n")
        for ph in self.extra:
            kind = StopPhase.of(ph.phase)
            if kind is StopPhase.RECONNECTING:  # the link dropped mid-stop: the stop goes on after it
                t.append("↻ link lost", style="bold yellow")
            elif kind is StopPhase.RECONNECTED:
                t.append("✔ link back", style="green")
            else:
                t.append(f"✔ {ph.phase}", style="green")
            if ph.detail:
                t.append(f"  {ph.detail}", style="dim")
            t.append("\n")
        return t

    def _saving_detail(self, ph: ActionPhase | None) -> str:
        if ph is None:
            return ""
        exp = ph.expected_s
        s = ""
        if StopPhase.SAVED not in self.phases:
            s += f"  {self.clock() - self.arrived[StopPhase.SAVING]:.0f}s"
            s += f" of ~{exp:.0f}s expected" if exp is not None else " (no past save to estimate from)"
        elif ph.detail:
            s += f"  {ph.detail}"
        return s

    def _failure(self) -> ActionPhase | None:
        order = (StopPhase.REFUSED, StopPhase.TIMEOUT, StopPhase.ERROR)
        return next((self.phases[n] for n in order if n in self.phases), None)

    def succeeded(self) -> bool:
        """Done, and neither failed nor raised."""
        res = self.result
        code = res.code if isinstance(res, ActionResult) else None
        return (
            self.done
            and not isinstance(res, Exception)
            and self._failure() is None
            and code in (Outcome.OK, None)
        )

    def outcome_text(self) -> Text:
        t = Text()
        failed = self._failure()
        if not self.done:
            left = max(0.0, self.timeout - self.elapsed())
            t.append(f"waiting… {self.elapsed():.0f}s elapsed, gives up in {left:.0f}s", style="bold")
            return t
        res = self.result if isinstance(self.result, ActionResult) else None
        code = res.code if res is not None else None
        msg = (res.message if res is not None else None) or (str(self.result) if self.result else "")
        if not self.succeeded():
            t.append("✖ ", style="bold red")
            if (failed is not None and failed.phase == StopPhase.TIMEOUT) or code == Outcome.STILL_RUNNING:
                tr = self.state.trainer
                pid = tr.pid if tr is not None else "?"
                t.append(
                    f"still running after {self.timeout:.0f} s; it was left running, not killed.\n",
                    style="bold red",
                )
                t.append(
                    "Watch the log (it may still be saving) and press s again to wait longer. "
                    f"Only if it hangs: kill -KILL {pid} in the container; checkpoints/latest "
                    "then still names the last complete checkpoint.",
                    style="yellow",
                )
            else:
                t.append(msg or (failed.detail if failed is not None else "failed"), style="bold red")
        else:
            said = {ph.detail for ph in self.extra}  # a restart's last phase says it already: not twice
            t.append("✔ ", style="bold green")
            t.append("done" if not msg or msg in said else msg, style="bold green")
        t.append("\nEscape closes; the screen's keys (q, s, ...) work again.", style="dim")
        return t
