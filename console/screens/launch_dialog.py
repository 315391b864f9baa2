"""Launch: trainer flags prefilled from the last run's argv (run.json), with its interpreter and
code directory; the flags field is focused and shows every flag (it wraps), Enter in a field launches,
Escape cancels. run.json's interpreter and code directory, left as prefilled, are checked by the restart's
rules (restart_trust.prefill_concerns): what only run.json vouches for is listed and needs ``trust`` typed in
the field that appears. The launch first runs the train/serve check against the target's serving
(console/core/serve_check.py; the dialog says up front what it will check, or why it is skipped): its errors
refuse the launch and are shown, and ``serve`` typed in the field that appears launches anyway (accepting
those lines only); its warnings never block (the screen's note of the launch says them). A launch that
succeeds closes the dialog with its result (the screen says what started); a failed one stays, saying why."""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from console.core.deploy import code_folder
from console.core.events import Outcome
from console.screens.flags_area import FlagsArea

Launcher = Callable[..., Awaitable[object]]  # (flags, python=..., code_dir=...) -> result
Vetter = Callable[..., Awaitable[list[str]]]  # (python, code_dir, run) of run.json's word -> concerns
TRUST_WORD = "trust"
SERVE_WORD = "serve"  # launches although the train/serve check failed (the errors shown)


def prefill(run: dict | None) -> tuple[str, str, str]:
    """(flags, python, code_dir) from run.json; empty where unknown. The code dir is the folder that
    holds the ``trainer`` package (deploy.code_folder: an old run.json's package folder is its parent)."""
    run = run or {}
    argv = run.get("argv")
    flags = shlex.join(str(a) for a in argv) if isinstance(argv, list) else ""
    python = run.get("interpreter") if isinstance(run.get("interpreter"), str) else "python3"
    code_dir = code_folder(run.get("code_dir")) if isinstance(run.get("code_dir"), str) else ""
    return flags, python, code_dir or ""


def submitted_as(place) -> str | None:
    """How a scheduler's place takes a launch ("a new Slurm job dflash (sbatch)"), None where the helper
    starts the trainer itself."""
    return f"a new {place.describe} ({place.SCHEDULER})" if getattr(place, "SCHEDULER", None) else None


class LaunchDialog(ModalScreen[object]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]
    DEFAULT_CSS = """
    LaunchDialog { align: center middle; }
    LaunchDialog > Vertical {
        width: 100; height: auto; max-height: 32; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    LaunchDialog #title { text-style: bold; margin-bottom: 1; }
    LaunchDialog Label { color: $text-muted; width: 100%; }  /* a long label wraps, never cut */
    LaunchDialog #buttons { height: 3; align-horizontal: right; margin-top: 1; }
    LaunchDialog Button { margin-left: 2; }
    """

    def __init__(
        self,
        run: dict | None,
        launcher: Launcher,
        live_pid: int | None = None,
        code_dir: str | None = None,
        submitted_as: str | None = None,
        vet: Vetter | None = None,
        serve: object | None = None,
    ) -> None:
        super().__init__()
        self.serve = serve  # the target's serving endpoint (serving.Endpoint): what the launch checks against
        self.serve_errors: tuple[str, ...] = ()  # the check's error lines shown (what "serve" accepts)
        self.vet = vet  # what run.json's prefill needs confirmed (restart_trust.prefill_concerns)
        self.shown_concerns: list[str] = []
        self.submitted_as = (
            submitted_as  # where a scheduler takes the launch: "a new Slurm job NAME (sbatch)"
        )
        self.code_dir = code_dir  # a code dir deployed from this screen replaces the last run's
        self.live_pid = live_pid
        self.last_run = run
        self.launcher = launcher
        self.result: object | None = None
        self.busy = False

    def compose(self) -> ComposeResult:
        flags, python, code_dir = prefill(self.last_run)
        code_dir = self.code_dir or code_dir
        with Vertical():
            src = "the last run's run.json" if self.last_run else "nothing (no run.json seen)"
            yield Static(
                Text("Launch the trainer  ", style="bold") + Text(f"prefilled from {src}", style="dim"),
                id="title",
            )
            if self.submitted_as:
                yield Label(f"submitted as {self.submitted_as}")
            yield Label("trainer flags (python -m trainer.pipeline …)")
            yield FlagsArea(flags, id="flags")
            yield Label("remote interpreter")
            yield Input(python, id="python")
            yield Label(
                "code directory (the folder that holds the trainer package, e.g. …/code/HASH; "
                "empty: deploy the bundled trainer)"
            )
            yield Input(code_dir, id="code_dir")
            yield Label(serve_check_label(self.serve), id="serve_check")
            warn = (
                Text(
                    f"A trainer (PID {self.live_pid}) is running: a launch into its run dir is refused.",
                    style="yellow",
                )
                if self.live_pid is not None
                else ""
            )
            yield Static(warn, id="outcome")
            with Horizontal(id="buttons"):
                yield Button("Cancel (Esc)", id="cancel", variant="primary")
                yield Button("Launch", id="launch", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#flags", FlagsArea).focus()  # Enter launches; a focused Cancel took it silently

    def action_cancel(self) -> None:
        if not self.busy:
            self.dismiss(self.result)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.action_cancel()

    @on(Button.Pressed, "#launch")
    @on(Input.Submitted)
    @on(FlagsArea.Submitted)
    def _launch(self) -> None:
        if self.busy:
            return
        try:
            flags = shlex.split(self.query_one("#flags", FlagsArea).value)
        except ValueError as exc:
            self._say(Text(f"flags: {exc}", style="bold red"))
            return
        python = self.query_one("#python", Input).value.strip() or "python3"
        code_dir = self.query_one("#code_dir", Input).value.strip() or None
        self.busy = True
        self._say(Text("launching… (waiting for the trainer's started event)", style="yellow"))
        self._go(flags, python, code_dir)

    def _from_run_json(self, python: str, code_dir: str | None) -> tuple[str | None, str | None]:
        """Which of ``python`` and ``code_dir`` are run.json's prefill, unchanged (None: the operator's)."""
        _, run_python, run_code = prefill(self.last_run) if self.last_run else ("", "", "")
        ours = self.code_dir is not None and code_dir == self.code_dir  # deployed from this screen
        return (
            python if run_python and python == run_python else None,
            code_dir if run_code and code_dir == run_code and not ours else None,
        )

    async def _unconfirmed(self, python: str, code_dir: str | None) -> list[str]:
        """What run.json's prefill asks for that the operator has not typed ``trust`` for."""
        if self.vet is None:
            return []
        concerns = await self.vet(*self._from_run_json(python, code_dir), self.last_run)
        boxes = self.query("#trust")
        typed = bool(boxes) and boxes.first(Input).value.strip() == TRUST_WORD
        if not concerns or (typed and set(concerns) <= set(self.shown_concerns)):
            return []
        self.shown_concerns = list(concerns)  # "trust" covers what was shown, nothing new
        if not boxes:
            box = Input(placeholder=f"type {TRUST_WORD} to confirm", id="trust")
            await self.query_one(Vertical).mount(box, before="#outcome")
        return concerns

    @work(exclusive=True, group="launch")
    async def _go(self, flags: list[str], python: str, code_dir: str | None) -> None:
        try:
            concerns = await self._unconfirmed(python, code_dir)
            if concerns:
                self._say(_concerns_text(concerns))
                return
            self.result = await self.launcher(
                flags,
                python=python,
                code_dir=code_dir,
                on_status=self._status,
                serve_accepted=self._serve_accepted(),
            )
        except Exception as exc:
            self.result = exc
        finally:
            self.busy = False
        if await self._serve_refused(self.result):
            return
        ok, text = describe(self.result)
        if ok:  # the screen says what started (the app's callback): nothing is left to do here
            self.dismiss(self.result)
            return
        self._say(
            Text(("✔ " if ok else "✖ ") + text + "   (Esc closes)", style="bold green" if ok else "bold red")
        )

    def _serve_accepted(self) -> tuple[str, ...]:
        """The check's error lines the operator accepted by typing ``serve`` (those shown, nothing new)."""
        boxes = self.query("#serve_ok")
        typed = bool(boxes) and boxes.first(Input).value.strip() == SERVE_WORD
        return self.serve_errors if typed else ()

    async def _serve_refused(self, result: object) -> bool:
        """A launch the train/serve check refused: its lines shown, and the field to type ``serve`` in."""
        check = getattr(result, "serve_check", None)
        if check is None or getattr(result, "code", None) == Outcome.OK or check.state != "failed":
            return False
        self.serve_errors = tuple(check.errors)
        if not self.query("#serve_ok"):
            box = Input(placeholder=f"type {SERVE_WORD} to launch anyway", id="serve_ok")
            await self.query_one(Vertical).mount(box, before="#outcome")
        t = Text(f"✖ the train/serve check fails: {check.summary}\n", style="bold red")
        for line in check.errors:
            t.append(f"  {line}\n", style="red")
        for line in check.warnings:
            t.append(f"  {line}\n", style="yellow")
        t.append(
            f'Fix the trainer flags or the data, or type "{SERVE_WORD}" above and press Enter to launch '
            "anyway (docs/serving.md).",
            style="yellow",
        )
        self._say(t)
        return True

    def _status(self, line: str) -> None:
        self._say(Text(f"launching… {line}", style="yellow"))

    def _say(self, text: Text) -> None:
        self.query_one("#outcome", Static).update(text)


def serve_check_label(serve: object | None) -> str:
    """What the launch's train/serve check will compare the flags with, or why it is skipped."""
    if serve is None:
        return (
            'train/serve check: skipped: the target names no serving (`serve = "vllm:PORT"` and '
            "`serve_thinking` in its config entry, or connect --serve)"
        )
    thinking = getattr(serve, "thinking", None)
    how = f"thinking {thinking}" if thinking else "thinking not compared: no serve_thinking"
    return f"train/serve check before launching: the flags against {serve} ({how})"


def _concerns_text(concerns: list[str]) -> Text:
    t = Text("Needs its own confirmation (only run.json vouches for it):\n", style="bold yellow")
    for c in concerns:
        t.append(f"  ! {c}\n", style="yellow")
    t.append(
        f'Type "{TRUST_WORD}" above and press Enter to launch it anyway, or change the field.', style="yellow"
    )
    return t


def describe(result: object) -> tuple[bool, str]:
    """(succeeded, what to say) for a launch's ActionResult or the exception it raised."""
    if isinstance(result, Exception):
        return False, f"{type(result).__name__}: {result}"
    code = getattr(result, "code", None)
    msg = getattr(result, "message", "") or ""
    pid = getattr(getattr(result, "trainer", None), "pid", None)
    if code == Outcome.OK:  # the message names the PID already ("launched pid N in DIR (code ...)")
        return True, msg if msg and str(pid) in msg else f"launched, PID {pid}" + (f": {msg}" if msg else "")
    return False, msg or f"launch failed (code {code})"
