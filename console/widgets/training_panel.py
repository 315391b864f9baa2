"""Training panel: the drafter's architecture (run.json argv: console/core/drafter_arch.py), step of total, epoch, loss, per-position accuracy, acceptance length, lr,
checkpoint age, ETA, the headline tok/s and the newest events. Plain styled text lines (cheap to
redraw several times a second)."""

from __future__ import annotations

from rich.text import Text

from console.core.drafter_arch import arch_text, drafter_arch
from console.core.formatting import fmt_duration, fmt_number, fmt_tok_s
from console.core.startup_fold import fraction, panel_parts
from console.core.state import ConsoleState
from console.widgets.alert_text import summary
from console.widgets.liveness import STALE, rates_live, running, stale_note
from console.widgets.text_widget import TextWidget

BARS = " ▁▂▃▄▅▆▇█"
LABEL_W = 11


def acc_text(acc: list[float], width: int | None = None) -> Text:
    """Per-position accuracy k=1..: a spark bar per position, then the values (``.93``) from k=1 on, as
    many as fit ``width`` columns; a "…" says some were left out (the spark bar has them all)."""
    if not acc:
        return Text("-")
    t = Text()
    t.append("".join(BARS[min(8, max(0, round(a * 8)))] for a in acc), style="green")
    values = [f"{a:.2f}".removeprefix("0") for a in acc]
    room = None if width is None else width - len(acc) - 2
    shown = len(values)
    while (
        room is not None
        and shown
        and len(" ".join(values[:shown])) + (2 if shown < len(values) else 0) > room
    ):
        shown -= 1
    t.append("  " + " ".join(values[:shown]))
    if shown < len(values):
        t.append(" …", style="dim")
    return t


def accept_text(state: ConsoleState) -> Text:
    """The newest measured acceptance length (an ``eval`` record), else the trainer's estimate, marked."""
    value, source = state.acceptance()
    t = Text(fmt_number(value, ".2f"), style="bold")
    if source == "eval":
        if state.eval_accept_len_se is not None:
            t.append(f" +- {state.eval_accept_len_se:.2f}")
        t.append(f" measured at step {state.eval_step}", style="dim")
        if state.accept_len_est is not None:
            t.append(f", est. now {state.accept_len_est:.2f}", style="dim")
    elif source == "estimate":
        t.append(" (estimate)", style="dim")
    return t


def served_text(state: ConsoleState) -> Text | None:
    """The serving endpoint's acceptance (``--serve``): ``3.91 vLLM :8000, 60 s, 1.2 req/s``; None without one."""
    s = state.served
    if s is None:
        return None
    if s.accept_length is None:
        return Text(f"- {s.endpoint}: {s.error or 'no figure yet'}", style="dim")
    low = state.health.f.accept_last and s.accept_length < (1 - state.health.config.served_drop) * (
        state.health.f.accept_last
    )
    t = Text(f"{s.accept_length:.2f}", style="bold red" if low else "bold green")
    over = "since start" if s.lifetime else f"{s.window_s:.0f} s"
    t.append(f" {s.endpoint}, {over}", style="dim")
    if s.req_per_s is not None:
        t.append(f", {s.req_per_s:.1f} req/s", style="dim")
    return t


def startup_text(v, what: str) -> Text:
    """What the start-up does, after a bar: time against the estimate, else the target's bytes."""
    frac = fraction(v)
    t = Text()
    if frac is not None:
        n = round(frac * 8)
        t.append("█" * n + "░" * (8 - n) + " ", style="cyan")
    t.append(what, style="yellow")
    return t


def panel_text(state: ConsoleState, n_events: int = 4, width: int | None = None) -> Text:
    """The panel's lines; ``width`` (columns) decides how many per-position accuracies are written out."""
    rows: list[tuple[str, Text | str]] = []
    live = rates_live(state)
    if live:
        tok = Text(fmt_tok_s(state.tok_s), style="bold cyan")
        tok.append(f" tok/s (drafters' sum, {state.avg_window_s:g} s mean)", style="dim")
    else:
        tok = stale_note(state)
    rows.append(("throughput", tok))
    rows.append(("drafter", arch_text(drafter_arch(state.run))))
    su = state.startup_view()
    if su is not None and su.active:  # launch to first step: phase, bytes, estimate (two rows while it lasts)
        what, when = panel_parts(su)
        rows[0:0] = [("start-up", startup_text(su, what)), ("first step", Text(when, style="yellow"))]
    step = "-" if state.step is None else f"{state.step:,}"
    if state.total_steps:
        percent = 100.0 * (state.step or 0) / state.total_steps
        step += f" / {state.total_steps:,}  ({percent:.1f}%)"
    rows.append(("step", step))
    rows.append(("epoch", fmt_number(state.epoch, ".2f")))
    rows.append(("loss", Text(fmt_number(state.loss, ".4f"), style="bold yellow")))
    rows.append(("accept len", accept_text(state)))
    served = served_text(state)
    if served is not None:
        rows.append(("served", served))
    rows.append(("acc k=1..", acc_text(state.acc, None if width is None else width - LABEL_W)))
    rows.append(("lr", fmt_number(state.lr, ".2e")))
    age = state.checkpoint_age_s()
    if state.saving_since is not None:
        exp = state.saving_expected_s
        ck = Text(
            f"saving… {fmt_duration(state.saving_elapsed_s())}"
            + (f" of ~{fmt_duration(exp)}" if exp is not None else ""),
            style="yellow",
        )
    elif age is None:
        ck = Text("none yet", style="dim")
    else:
        ck = Text(f"{fmt_duration(age)} ago (step {state.ckpt_step})", style="red" if age > 3600 else "")
    rows.append(("checkpoint", ck))
    rows.append(("ETA", fmt_duration(state.eta_s() if live else None)))
    rows.append(("health", summary(state.health, state.clock(), ok_text="ok")))
    stale = not running(state)  # the last known figures: dimmed (the throughput row says how old)
    t = Text(no_wrap=True, overflow="ellipsis")
    for i, (label, value) in enumerate(rows):
        if i:
            t.append("\n")
        t.append(label.ljust(LABEL_W), style="dim")
        value = value.copy() if isinstance(value, Text) else Text(value)
        if stale and label not in ("throughput", "health"):
            value.stylize(STALE)
        t.append(value)
    t.append("\n")
    for e in list(state.events)[-n_events:]:
        t.append("\n")
        t.append(e.text, style={"warn": "yellow", "error": "bold red"}.get(e.level, "dim"))
    return t


class TrainingPanel(TextWidget):
    DEFAULT_CSS = "TrainingPanel { height: 100%; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._state: ConsoleState | None = None

    def on_resize(self) -> None:
        if self._state is not None:
            self.update_from(self._state)

    def update_from(self, state: ConsoleState) -> None:
        self._state = state
        # eleven lines of figures (thirteen during a start-up) and a blank one; the newest events fill what is left
        su = state.startup_view()
        used = 14 if su is not None and su.active else 12
        width = self.content_size.width or None
        self.set_content(panel_text(state, n_events=max(0, self.size.height - used), width=width))
