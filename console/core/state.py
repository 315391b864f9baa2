"""The operator screen's view model: a fold of session events into what the screen shows.

Headless (no Textual), so it is tested and benchmarked alone; the widgets only read it. Time comes
from an injected ``clock`` so a snapshot can freeze it. Every change bumps ``version``, which lets
the screen skip repaints when nothing moved.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from console.core.devices import join_devices
from console.core.events import (
    ActionPhase,
    ConnState,
    DiskInfo,
    Event,
    Gpu,
    GpuSample,
    JobState,
    Record,
    ServedState,
    TelemetryState,
    TrainerFound,
    TrainerInfo,
)
from console.core.formatting import fmt_bytes
from console.core.health import Health
from console.core.metrics import TOK_S_WINDOW_S, headline_tok_s
from console.core.numeric import number
from console.core.startup_fold import StartupFold, StartupView


@dataclass
class DeviceRow:
    """One line of the GPU table: a GPU from telemetry, a trainer device, or both joined."""

    label: str  # "0" for GPU 0, or the trainer's device name ("cpu") when no GPU matches
    name: str = ""
    uuid: str | None = None
    device: str | None = None  # the trainer's name for it: "cuda:3", "cpu"
    role: str | None = None
    util: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    power: float | None = None
    temp: float | None = None
    tok_s: float | None = None
    busy: float | None = None
    host: str | None = None  # the worker's node, for a run whose workers are on several


@dataclass
class EventLine:
    t: float | None
    text: str
    level: str = "info"  # info | warn | error


@dataclass
class Conn:
    state: str = "connecting"
    detail: str = ""
    retry_in: float | None = None
    retry_at: float | None = None  # clock time of the next attempt
    since: float = 0.0


@dataclass
class ConsoleState:
    """Everything the screen shows, folded from events. Histories are bounded."""

    clock: Callable[[], float] = time.time
    history: int = 600  # points kept per graph
    avg_window_s: float = TOK_S_WINDOW_S  # tok/s shown is the mean over this much record time
    max_events: int = 200

    version: int = 0
    conn: Conn = field(default_factory=Conn)
    telemetry_available: bool | None = None
    telemetry_detail: str = ""
    job: JobState | None = None  # the place's scheduler job (a Slurm job), as last polled
    served: ServedState | None = None  # the serving endpoint's acceptance, as last polled
    trainer: TrainerInfo | None = None
    trainer_known: bool = False  # a TrainerFound has arrived (None then means: no trainer)
    last_run: dict | None = None  # run.json of the newest trainer seen; kept after it exits
    trainer_exited: bool = False

    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    acc: list[float] = field(default_factory=list)
    accept_len: float | None = None  # the old product estimate (runs from before accept_len_est)
    accept_len_est: float | None = None  # the trainer's running estimate (step records)
    eval_accept_len: float | None = None  # the newest real value (an `eval` record)
    eval_accept_len_se: float | None = None  # its standard error over the evaluation's prompts, if recorded
    eval_step: int | None = None
    lr: float | None = None
    grad_norm: float | None = None
    last_step_t: float | None = None

    devices: list[dict] = field(default_factory=list)  # last throughput's devices
    tok_s: float | None = None  # headline: drafters' sum (window mean)
    role_tok_s: dict[str, float] = field(default_factory=dict)
    queue_depth: int | None = None
    queue_capacity: int | None = None
    last_throughput_t: float | None = None

    gpus: list[Gpu] = field(default_factory=list)  # the last GpuSample's
    gpu_t: float | None = None

    ckpt_t: float | None = None
    ckpt_step: int | None = None
    ckpt_path: str | None = None
    ckpt_seconds: float | None = None
    saving_since: float | None = None  # a checkpoint_saving without its checkpoint_saved yet
    saving_expected_s: float | None = None
    stopped: dict | None = None  # the last "stopped" event
    health: Health | None = None  # the health rules over the same events (console/core/health.py)
    disk: DiskInfo | None = None  # the run dir's checkpoints and free space (console/core/checkpoints.py)

    def __post_init__(self) -> None:
        self.tok_hist: deque[tuple[float, float, dict[str, float]]] = deque(maxlen=self.history)
        self.loss_hist: deque[tuple[int, float]] = deque(maxlen=self.history)
        # acceptance length by step: the trainer's estimate (step records' accept_len_est) and the
        # measured value (eval records), two series of one graph
        self.accept_est_hist: deque[tuple[int, float]] = deque(maxlen=self.history)
        self.eval_hist: deque[tuple[int, float]] = deque(maxlen=self.history)
        self.events: deque[EventLine] = deque(maxlen=self.max_events)
        self._steps: deque[tuple[float, int]] = deque(maxlen=64)  # (t, step) for the ETA
        self._tp: deque[tuple[float, list[dict]]] = deque()  # throughput records in the window
        self.records = 0
        self._ever_connected = False
        # the run's start-up: phase, bytes, estimate (console/core/startup_fold.py)
        self.startup = StartupFold()
        self.conn.since = self.clock()
        if self.health is None:
            self.health = Health(clock=self.clock)

    # ---- folding ------------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one session event (LogLines are the log widget's; anything else is ignored)."""
        self.health.apply(event)
        match event:
            case DiskInfo():
                self.disk = event
                self._touch()
            case JobState():
                self.job = event
                self._touch()
            case ServedState():
                self.served = event
                self._touch()
            case ConnState():
                self._on_conn_state(event)
            case Record():
                self.apply_record(event.record)
            case GpuSample():
                self.set_gpus(event.gpus)
            case TelemetryState():
                self._on_telemetry_state(event)
            case TrainerFound():
                self._on_trainer_found(event)
            case ActionPhase():
                self._on_action_phase(event)

    def apply_all(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.apply(ev)

    def _touch(self) -> None:
        self.version += 1

    def _on_conn_state(self, ev: ConnState) -> None:
        if (ev.state == "connected") != (self.conn.state == "connected"):
            self.conn.since = self.clock()  # "for how long" counts from the last up/down change
        if ev.state != self.conn.state:
            if self._ever_connected and self.conn.state == "connected":
                self._event(None, f"connection lost: {ev.detail}".rstrip(": "), "warn")
            elif ev.state == "connected" and self._ever_connected:
                self._event(None, "connection restored")
        if ev.state == "connected":
            self._ever_connected = True
        self.conn.state = ev.state
        self.conn.detail = ev.detail or ""
        self.conn.retry_in = ev.retry_in
        self.conn.retry_at = None if ev.retry_in is None else self.clock() + ev.retry_in
        self._touch()

    def _on_telemetry_state(self, ev: TelemetryState) -> None:
        self.telemetry_available = bool(ev.available)
        self.telemetry_detail = ev.detail or ""
        self._touch()

    def _on_trainer_found(self, ev: TrainerFound) -> None:
        tr = ev.trainer
        self.trainer_known = True
        prev = self.trainer
        self.trainer = tr
        if tr is not None:
            self.trainer_exited = False
            if isinstance(tr.run, dict):
                self.last_run = tr.run
            if prev is None or prev.pid != tr.pid:
                self._event(None, f"trainer found: PID {tr.pid} ({tr.source})")
        elif prev is not None:
            self.trainer_exited = True
            self._event(None, f"trainer PID {prev.pid} is gone")
        self._touch()

    def _on_action_phase(self, ev: ActionPhase) -> None:
        level = "error" if ev.phase in ("timeout", "refused", "error") else "info"
        self._event(ev.t, f"stop: {ev.phase} {ev.detail}".rstrip(), level)
        self._touch()

    def set_gpus(self, gpus: list[Gpu]) -> None:
        self.gpus = list(gpus)
        self.gpu_t = self.clock()
        self._touch()

    def apply_record(self, rec: dict) -> None:
        """Fold one metrics.jsonl record; unknown kinds and fields are ignored."""
        kind = rec.get("kind")
        t = number(rec.get("t"))
        self.records += 1
        if kind == "step":
            self._on_step(rec, t)
        elif kind == "throughput":
            self._on_throughput(rec, t)
        elif kind == "event":
            self._on_event(rec, t)
        elif kind == "eval":
            self._on_eval(rec, t)
        elif kind == "startup":
            self._on_startup(rec, t)
        else:
            return
        self._touch()

    def _on_step(self, rec: dict, t: float | None) -> None:
        self.startup.apply(rec)  # a step ends the start-up
        step = rec.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            if self.step is not None and step < self.step:
                self._steps.clear()  # a restart from an older checkpoint: the rate starts over
            self.step = step
            if t is not None:
                self._steps.append((t, step))
        total = rec.get("total_steps")
        if isinstance(total, int) and not isinstance(total, bool):
            self.total_steps = total
        for name in ("epoch", "loss", "accept_len", "accept_len_est", "lr", "grad_norm"):
            if name in rec:
                setattr(self, name, number(rec.get(name)))
        acc = rec.get("acc")
        if isinstance(acc, list):
            self.acc = [v for v in (number(a) for a in acc) if v is not None]
        self.last_step_t = t
        if self.step is not None and self.loss is not None:
            self.loss_hist.append((self.step, self.loss))
        if self.step is not None and self.accept_len_est is not None and "accept_len_est" in rec:
            self.accept_est_hist.append((self.step, self.accept_len_est))

    def _on_eval(self, rec: dict, t: float | None) -> None:
        value, step = number(rec.get("accept_len")), rec.get("step")
        if value is None:
            return
        self.eval_accept_len = value
        self.eval_accept_len_se = number(rec.get("accept_len_se"))
        self.eval_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        if self.eval_step is not None:
            self.eval_hist.append((self.eval_step, value))
        self._event(t, f"eval: acceptance length {value:.2f} at step {step}")

    def acceptance(self) -> tuple[float | None, str]:
        """(value, source) of the acceptance length to show: the newest ``eval`` record's (``"eval"``), else
        the trainer's running estimate (``"estimate"``), else an old run's product estimate (``"old"``)."""
        if self.eval_accept_len is not None:
            return self.eval_accept_len, "eval"
        if self.accept_len_est is not None:
            return self.accept_len_est, "estimate"
        return self.accept_len, "old"

    def _smooth(self, devs: list[dict], t: float | None) -> list[dict]:
        """Each device's tok_s as its mean over the last ``avg_window_s`` of records (a trainer's
        windows can be shorter than a step, so single records jump between 0 and a burst)."""
        if t is None:
            return devs
        self._tp.append((t, devs))
        while self._tp and t - self._tp[0][0] > self.avg_window_s:
            self._tp.popleft()
        sums: dict[tuple, list[float]] = {}
        for _, ds in self._tp:
            for d in ds:
                v = number(d.get("tok_s"))
                if v is not None:
                    sums.setdefault((d.get("device"), d.get("uuid"), d.get("role")), []).append(v)
        out = []
        for d in devs:
            vals = sums.get((d.get("device"), d.get("uuid"), d.get("role")))
            out.append({**d, "tok_s": sum(vals) / len(vals)} if vals else d)
        return out

    def _on_throughput(self, rec: dict, t: float | None) -> None:
        devs = [d for d in rec.get("devices") or [] if isinstance(d, dict)]
        devs = self._smooth(devs, t)
        self.devices = devs
        self.tok_s = headline_tok_s({"devices": devs})
        roles: dict[str, float] = {}
        for d in devs:
            v = number(d.get("tok_s"))
            role = d.get("role")
            if v is not None and isinstance(role, str):
                roles[role] = roles.get(role, 0.0) + v
        self.role_tok_s = roles
        q = rec.get("queue")
        if isinstance(q, dict):
            depth, cap = q.get("depth"), q.get("capacity")
            self.queue_depth = int(depth) if number(depth) is not None else None
            self.queue_capacity = int(cap) if number(cap) is not None else None
        self.last_throughput_t = t
        if t is not None:
            self.tok_hist.append((t, self.tok_s, roles))

    def _on_event(self, rec: dict, t: float | None) -> None:
        name = rec.get("name")
        self.startup.apply(rec)
        if name == "started":
            self.stopped = None
            self.saving_since = None
            self._event(t, f"trainer started (PID {rec.get('pid')}, step {rec.get('step')})")
        elif name == "stop_requested":
            self._event(t, f"stop requested ({rec.get('signal')})", "warn")
        elif name == "checkpoint_saving":
            self.saving_since = t
            self.saving_expected_s = number(rec.get("expected_s"))
            exp = self.saving_expected_s
            self._event(
                t,
                f"saving checkpoint at step {rec.get('step')}"
                + (f" (expect ~{exp:.0f} s)" if exp is not None else ""),
            )
        elif name == "checkpoint_saved":
            self.saving_since = None
            self.ckpt_t = t
            step = rec.get("step")
            self.ckpt_step = step if isinstance(step, int) else None
            self.ckpt_path = rec.get("path") if isinstance(rec.get("path"), str) else None
            self.ckpt_seconds = number(rec.get("seconds"))
            secs = self.ckpt_seconds
            self._event(
                t,
                f"checkpoint saved: step {step}"
                + (f" in {secs:.1f} s" if secs is not None else "")
                + f", {fmt_bytes(rec.get('bytes'))}",
            )
        elif name == "stopped":
            self.stopped = rec
            self.saving_since = None
            level = "info" if rec.get("reason") in ("signal", "finished") else "error"
            self._event(t, f"trainer stopped: {rec.get('reason')} (exit {rec.get('exit_code')})", level)
        elif name == "nan_skipped":
            self._event(t, f"NaN loss, step {rec.get('step')} skipped", "warn")
        elif name == "error":
            self._event(t, f"trainer error: {rec.get('message')}", "error")
        elif isinstance(name, str):
            self._event(t, f"event {name}")

    def _on_startup(self, rec: dict, t: float | None) -> None:
        """A start-up record: the panel's start-up line (console/core/startup_fold.py); events for the list are
        only a compile cache that was not reused and the first step."""
        self.startup.apply(rec)
        phase = rec.get("phase")
        if phase == "compile_cache" and rec.get("state") == "stale":
            self._event(t, f"compile cache not reused: {rec.get('reason')}", "warn")
        elif phase == "first_step":
            secs = number(rec.get("seconds"))
            self._event(t, "first step" + (f" {secs:.1f} s after launch" if secs is not None else ""))

    def note(self, text: str, level: str = "info") -> None:
        """An event line of the screen's own (a deploy's outcome, ...)."""
        self._event(None, text, level)
        self._touch()

    def _event(self, t: float | None, text: str, level: str = "info") -> None:
        self.events.append(EventLine(t if t is not None else self.clock(), text, level))

    # ---- derived views ------------------------------------------------------------------------

    @property
    def run(self) -> dict | None:
        """run.json of the current trainer, else of the last one seen."""
        run = self.trainer.run if self.trainer is not None else None
        return run if isinstance(run, dict) else self.last_run

    def rows(self) -> list[DeviceRow]:
        """GPU rows joined to the trainer's devices (console/core/devices.py: the rule ``status``
        uses too), followed by trainer devices that match no GPU (the CPU demo's ``cpu``)."""
        rows: list[DeviceRow] = []
        several = len({d.get("host") for d in self.devices if isinstance(d, dict)}) > 1
        for g, d in join_devices(self.gpus, {"devices": self.devices}, self.run):
            if g is None:
                row = DeviceRow(label=str(d.get("device") or "?"), uuid=d.get("uuid"))
            else:
                row = DeviceRow(
                    label=str(g.index),
                    name=g.name or "",
                    uuid=g.uuid,
                    util=g.util,
                    mem_used=g.mem_used,
                    mem_total=g.mem_total,
                    power=g.power,
                    temp=g.temp,
                )
            if d is not None:
                self._join(row, d)
                row.host = d.get("host") if several and isinstance(d.get("host"), str) else None
            rows.append(row)
        return rows

    @staticmethod
    def _join(row: DeviceRow, d: dict) -> None:
        row.device = d.get("device") if isinstance(d.get("device"), str) else None
        row.role = d.get("role") if isinstance(d.get("role"), str) else None
        row.tok_s = number(d.get("tok_s"))
        row.busy = number(d.get("busy"))

    def steps_per_s(self) -> float | None:
        """Step rate over the recent step records (record time, not the clock)."""
        if len(self._steps) < 2:
            return None
        (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def eta_s(self) -> float | None:
        """Seconds to total_steps at the recent step rate; None while unknown."""
        rate = self.steps_per_s()
        if rate is None or self.step is None or self.total_steps is None:
            return None
        return max(0.0, (self.total_steps - self.step) / rate)

    def checkpoint_age_s(self) -> float | None:
        return None if self.ckpt_t is None else max(0.0, self.clock() - self.ckpt_t)

    def saving_elapsed_s(self) -> float | None:
        return None if self.saving_since is None else max(0.0, self.clock() - self.saving_since)

    def retry_left_s(self) -> float | None:
        return None if self.conn.retry_at is None else max(0.0, self.conn.retry_at - self.clock())

    def conn_age_s(self) -> float:
        return max(0.0, self.clock() - self.conn.since)

    def startup_view(self) -> StartupView | None:
        """The run's start-up (console/core/startup_fold.py); None before any start-up record."""
        return self.startup.view(self.clock())

    def data_age_s(self) -> float | None:
        """Seconds since the newest step or throughput record was written."""
        ts = [t for t in (self.last_step_t, self.last_throughput_t) if t is not None]
        return None if not ts else max(0.0, self.clock() - max(ts))
