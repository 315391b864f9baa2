"""Restart: the stop dialog (console/screens/stop_dialog.py) that first shows what the relaunch will run.

One meaning for restart, as the CLI's ``restart``: stop cleanly (when a trainer runs), then launch
run.json's command with ``--resume auto``. The dialog shows the interpreter, code directory, working
directory, environment and command (``RestartPlan.lines``); with no trainer running it offers the
relaunch alone. What only run.json vouches for (console/core/restart_trust.py) is listed, and ``y`` does
not cover it: the operator types ``trust`` in the field below the list and presses Enter.
"""

from __future__ import annotations

import functools

from rich.text import Text
from textual import on
from textual.containers import Vertical
from textual.widgets import Button, Input, Static

from console.core.launching import RestartPlan
from console.core.state import ConsoleState
from console.screens.stop_dialog import Runner, StopDialog

TRUST_WORD = "trust"


class RestartDialog(StopDialog):
    DEFAULT_CSS = """
    RestartDialog > Vertical { max-height: 95%; overflow-y: auto; }
    RestartDialog #trust { margin-bottom: 1; }
    """

    def __init__(
        self,
        state: ConsoleState,
        runner: Runner,
        plan: RestartPlan,
        concerns: list[str],
        *,
        timeout: float = 120.0,
    ) -> None:
        super().__init__("restart", state, runner, timeout=timeout)
        self.plan = plan
        self.concerns = list(concerns)
        self.relaunch_only = state.trainer is None  # nothing to stop: the relaunch alone

    def _explain(self) -> Text:
        t = Text()
        if self.relaunch_only:
            t.append("No trainer is running: the run is launched again with --resume auto.\n", style="bold")
        else:
            t.append(
                "It gets SIGINT, writes a checkpoint and exits; nothing is killed. Then it is launched "
                f"again with --resume auto. Gives up waiting after {self.timeout:.0f} s.\n",
                style="dim",
            )
        t.append("It will run (from run.json):\n", style="dim")
        for ln in self.plan.lines():
            name, _, value = ln.partition(": ")
            t.append(f"  {name}: ", style="dim")
            t.append(value + "\n")
        if self.concerns:
            t.append("Needs its own confirmation (only run.json vouches for it):\n", style="bold yellow")
            for c in self.concerns:
                t.append(f"  ! {c}\n", style="yellow")
            t.append(
                f'Type "{TRUST_WORD}" below and press Enter to run it anyway; y alone does not.',
                style="yellow",
            )
        return t

    def title_text(self) -> str:
        if not self.relaunch_only:
            return super().title_text()
        if self.started_at is None:
            return "Launch the run again?"
        if not self.done:
            return "Launching the run again…"
        return "Run launched again" if self.succeeded() else "The launch did not finish"

    def on_mount(self) -> None:
        super().on_mount()
        if self.relaunch_only:
            self.query_one("#yes", Button).label = "Yes, launch (y)"
        if self.concerns:
            box = Input(placeholder=f"type {TRUST_WORD} to confirm", id="trust")
            self.query_one(Vertical).mount(box, before="#phases")

    def _trusted(self) -> bool:
        return not self.concerns or self.query_one("#trust", Input).value.strip() == TRUST_WORD

    @on(Input.Submitted, "#trust")
    def _submitted(self) -> None:
        self.action_confirm()

    def action_confirm(self) -> None:
        if self.started_at is not None:
            return
        if not self._trusted():
            self.notify(
                f'type "{TRUST_WORD}" first: y alone does not cover what run.json asks for',
                severity="warning",
            )
            return
        if self.relaunch_only != (self.state.trainer is None):  # it started or ended since r was pressed
            self.notify("the trainer changed: close this and press r again", severity="warning")
            return
        if self.concerns:
            self.runner = functools.partial(self.runner, trusted=tuple(self.concerns))
            self.query_one("#trust", Input).display = False
        self.started_at = self.clock()
        self.add_class("running")
        self.query_one("#explain", Static).display = False
        self._show()
        self.set_interval(0.25, self._show)
        self._run()

    def phases_text(self) -> Text:
        if not self.relaunch_only:
            return super().phases_text()
        t = Text()
        for ph in self.extra:
            t.append(f"✔ {ph.phase}", style="green")
            if ph.detail:
                t.append(f"  {ph.detail}", style="dim")
            t.append("\n")
        return t
