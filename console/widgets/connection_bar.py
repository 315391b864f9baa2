"""Connection bar: always visible; says connected / reconnecting (with the retry countdown) /
disconnected, which host, which trainer, and whether this screen is read-only."""

from __future__ import annotations

from rich.text import Text

from console.core.formatting import fmt_duration
from console.core.state import ConsoleState
from console.widgets.alert_text import summary
from console.widgets.text_widget import TextWidget

STYLE = {
    "connected": ("●", "bold green"),
    "connecting": ("◌", "bold yellow"),
    "reconnecting": ("◌", "bold yellow"),
    "disconnected": ("✖", "bold red"),
}


def bar_text(state: ConsoleState, target: str, readonly: bool) -> Text:
    """State first, then what must never be cut off (read-only, the retry countdown), then the
    host and trainer; the connection's detail comes last and may be cut at the edge."""
    c = state.conn
    mark, style = STYLE.get(c.state, ("?", "bold"))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {mark} {c.state.upper()} ", style=style + " reverse")
    if readonly:
        t.append(" READ-ONLY ", style="bold black on yellow")
    if c.state != "connected":
        left = state.retry_left_s()
        if left is not None:
            t.append(f" retry in {left:.0f}s", style="bold yellow")
        t.append(f" (for {fmt_duration(state.conn_age_s())})", style="dim")
    t.append(f"  {target}" if target else "")
    job = job_part(state)
    if job:
        t.append(f"  {job[0]}", style=job[1])
    tr = state.trainer
    if tr is not None:
        t.append(f"  trainer PID {tr.pid}", style="bold")
        t.append(f" ({tr.source})", style="dim")
    elif state.trainer_known:
        t.append("  no trainer running", style="yellow")
    if state.telemetry_available is False:
        t.append("  no GPU telemetry", style="dim")
    alerts = summary(state.health, state.clock())
    if alerts:
        t.append(" ")
        t.append(alerts)
    if c.state != "connected" and c.detail:
        t.append(f"  {c.detail}", style="yellow")
    return t


def job_part(state: ConsoleState) -> tuple[str, str] | None:
    """The place's scheduler job (a Slurm job): ``job 12 RUNNING on gpu[01-02] 1h58m left`` and its style,
    else None."""
    job = state.job
    if job is None:
        return None
    if job.error:
        return "job: ?", "dim"
    if not job.job:
        return "no job", "yellow"
    text = f"job {job.job} {job.state}" + (f" ({job.reason})" if job.reason else "")
    if job.state == "PENDING" and job.position:
        text += f" {job.position}/{job.queued} in queue"
    if job.nodes and job.state == "RUNNING":
        text += f" on {job.nodes if len(job.nodes) <= 24 else job.nodes[:23] + '…'}"
    if job.left_s is None or job.state != "RUNNING":
        return text, "yellow" if job.state == "PENDING" else "bold"
    left = max(0.0, job.left_s - max(0.0, state.clock() - job.t))
    return f"{text} {fmt_duration(left)} left", "bold"


class ConnectionBar(TextWidget):
    DEFAULT_CSS = "ConnectionBar { height: 1; background: $panel; }"

    def __init__(self, target: str = "", readonly: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.readonly = readonly

    def update_from(self, state: ConsoleState) -> None:
        self.set_content(bar_text(state, self.target, self.readonly))
