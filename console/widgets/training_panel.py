"""Training panel: step of total, epoch, loss, per-position accuracy, acceptance length, lr,
checkpoint age, ETA, the headline tok/s and the newest events."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from console.core.state import ConsoleState, fmt_duration, fmt_tok_s

BARS = " ▁▂▃▄▅▆▇█"


def acc_text(acc: list[float], limit: int = 8) -> Text:
    """Per-position accuracy k=1..: a spark bar per position, then the first few values."""
    if not acc:
        return Text("-")
    t = Text()
    for a in acc:
        t.append(BARS[min(8, max(0, round(a * 8)))], style="green")
    t.append("  " + " ".join(f"{a:.2f}" for a in acc[:limit]))
    if len(acc) > limit:
        t.append(" …", style="dim")
    return t


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def panel_renderable(state: ConsoleState, n_events: int = 4):
    g = Table.grid(padding=(0, 1))
    g.add_column(style="dim", no_wrap=True, min_width=10)
    g.add_column(no_wrap=True, overflow="ellipsis")
    tok = Text(fmt_tok_s(state.tok_s), style="bold cyan")
    tok.append(f" tok/s (drafters' sum, {state.avg_window_s:g} s mean)", style="dim")
    g.add_row("throughput", tok)
    step = "-" if state.step is None else f"{state.step:,}"
    if state.total_steps:
        pct = 100.0 * (state.step or 0) / state.total_steps
        step += f" / {state.total_steps:,}  ({pct:.1f}%)"
    g.add_row("step", step)
    g.add_row("epoch", _f(state.epoch, ".2f"))
    g.add_row("loss", Text(_f(state.loss, ".4f"), style="bold yellow"))
    g.add_row("accept len", Text(_f(state.accept_len, ".2f"), style="bold"))
    g.add_row("acc k=1..", acc_text(state.acc))
    g.add_row("lr", _f(state.lr, ".2e"))
    age = state.checkpoint_age_s()
    if state.saving_since is not None:
        exp = state.saving_expected_s
        ck = Text(f"saving… {fmt_duration(state.saving_elapsed_s())}"
                  + (f" of ~{fmt_duration(exp)}" if exp is not None else ""), style="yellow")
    elif age is None:
        ck = Text("none yet", style="dim")
    else:
        ck = Text(f"{fmt_duration(age)} ago (step {state.ckpt_step})",
                  style="red" if age > 3600 else "")
    g.add_row("checkpoint", ck)
    g.add_row("ETA", fmt_duration(state.eta_s()))
    ev = Table.grid()
    ev.add_column(no_wrap=True, overflow="ellipsis")
    for e in list(state.events)[-n_events:]:
        style = {"warn": "yellow", "error": "bold red"}.get(e.level, "dim")
        ev.add_row(Text(e.text, style=style))
    return Group(g, Text(""), ev)


class TrainingPanel(Static):
    DEFAULT_CSS = "TrainingPanel { height: auto; }"

    def update_from(self, state: ConsoleState) -> None:
        self.update(panel_renderable(state))
