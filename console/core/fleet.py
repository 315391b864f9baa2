"""Several runs at once: one :class:`Run` per target (a session, its folded state, its recent log
lines), sessions of one host sharing one connection (console/core/hostlink.py). Each session
connects, reconnects and reports on its own, so one unreachable host never stalls the others.
No Textual here: the overview screen (console/screens/overview.py) and the fleet app read this.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from console.core.events import Event, LogLines
from console.core.health import RANK
from console.core.hostlink import HostLinks
from console.core.session import Session
from console.core.state import ConsoleState
from console.core.targets import Target


@dataclass
class Run:
    target: Target
    session: object  # a ScreenSession (console.core.session.Session for a live one)
    state: ConsoleState
    log_lines: deque = field(default_factory=lambda: deque(maxlen=5000))
    deployed_code_dir: str | None = None
    watch: object | None = None  # its CheckpointWatch, while the screen runs

    @property
    def readonly(self) -> bool:
        return self.target.readonly or bool(getattr(self.session, "readonly", False))

    def apply(self, event: Event) -> None:
        """Fold one event of this run's session (log lines are kept, bounded)."""
        if isinstance(event, LogLines):
            self.log_lines.extend(event.lines)
        else:
            self.state.apply(event)


def build_runs(
    targets: list[Target],
    clock: Callable[[], float] | None = None,
    session_factory: Callable[..., object] = Session,
    **session_kw,
) -> list[Run]:
    """A session per target; targets with the same connection options share one SSH connection."""
    links = HostLinks()
    runs = []
    for t in targets:
        s = session_factory(
            t.options,
            place=t.place,
            run_dir=t.run_dir,
            readonly=t.readonly,
            link=links.get(t.options),
            pyspy=t.pyspy,
            **({"serve": t.serve} if t.serve is not None else {}),
            **session_kw,
        )
        st = ConsoleState(clock=clock) if clock is not None else ConsoleState()
        runs.append(Run(t, s, st))
    return runs


# ---- one row of the overview ----------------------------------------------------------------------

COLUMNS = ("#", "run", "host / CT", "state", "step", "tok/s", "loss", "accept", "queue", "ckpt", "health")
SORT_KEYS = ("#", "run", "state", "step", "tok/s", "loss", "accept", "ckpt", "health")


def run_state(st: ConsoleState) -> str:
    """One word for the run: the link first, then what the trainer does."""
    c = st.conn.state
    if c != "connected":
        return c
    if st.saving_since is not None:
        return "saving"
    if st.trainer is not None:
        return "running"
    if not st.trainer_known:
        return "looking"
    if st.stopped is not None:
        return "stopped"
    return "no trainer"


def row_values(index: int, run: Run) -> dict:
    """The overview's row of a run as values (None where unknown), for sorting and for text."""
    return state_row(index, run.target.title, run.target.where, run.state, run.readonly)


def state_row(index: int, title: str, where: str, st: ConsoleState, readonly: bool = False) -> dict:
    acc, source = st.acceptance()
    return {
        "#": index + 1,
        "run": title,
        "host / CT": where,
        "state": run_state(st),
        "step": st.step,
        "total": st.total_steps,
        "tok/s": st.tok_s,
        "loss": st.loss,
        "accept": acc,
        "accept_source": source,
        "queue": (st.queue_depth, st.queue_capacity),
        "ckpt": st.checkpoint_age_s(),
        "health": st.health.level() if st.health is not None else "ok",
        "readonly": readonly,
    }


def sort_key(values: dict, column: str):
    """Missing values sort last; health sorts worst first."""
    v = values.get(column)
    if column == "health":
        return (0, -RANK.get(v, 0))
    if v is None:
        return (1, 0)
    return (0, v)


def row_line(v: dict) -> str:
    """A row as one line of plain text (``status`` of a record)."""
    parts = [f"{v['run']} ({v['host / CT']}): {v['state']}"]
    if v["step"] is not None:
        parts.append(f"step {v['step']}/{v['total'] if v['total'] is not None else '?'}")
    if v["loss"] is not None:
        parts.append(f"loss {v['loss']:.4f}")
    if v["accept"] is not None:
        parts.append(
            f"accept_len {v['accept']:.2f}" + ("" if v["accept_source"] == "eval" else " (estimate)")
        )
    if v["tok/s"] is not None:
        d, c = v["queue"]
        parts.append(
            f"tok/s {v['tok/s']:.0f}  queue {d if d is not None else '?'}/{c if c is not None else '?'}"
        )
    if v["ckpt"] is not None:
        parts.append(f"ckpt {v['ckpt']:.0f} s before the end")
    parts.append(f"health {v['health']}")
    return "  ".join(parts)
