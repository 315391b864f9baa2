"""Health rules: "is this run all right?" from what a session already receives.

:class:`Health` folds the session's events (console/core/events.py) into the few facts the rules
need, plus the run directory's disk facts (:class:`DiskInfo`, from console/core/checkpoints.py), and
:meth:`Health.evaluate` turns them into :class:`Alert`\\ s at the injected clock's time. Nothing here
sleeps or reads the wall clock by itself, so every rule is tested with a frozen clock; the screen calls
``evaluate`` on a timer and after events, ``status --check`` once.

Levels: ``ok`` < ``note`` < ``warning`` < ``critical``. A note (the running trainer's code is not
the bundled one) is listed but rings nothing. Durations compare record times with record times (the
trainer host's clock) or local receive times with the local clock, never one with the other, so a
skewed remote clock cannot raise anything.
"""

from __future__ import annotations

import math
import posixpath
import re
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from console.core.events import (
    ActionPhase,
    DiskInfo,
    Event,
    Gpu,
    GpuSample,
    JobState,
    Record,
    ServedState,
    TrainerFound,
)
from console.core.formatting import fmt_bytes, fmt_duration
from console.core.numeric import number
from console.core.phases import SIGNALLED, StopPhase

OK, NOTE, WARNING, CRITICAL = "ok", "note", "warning", "critical"
RANK = {OK: 0, NOTE: 1, WARNING: 2, CRITICAL: 3}


@dataclass
class HealthConfig:
    """Thresholds: the ``[health]`` section of the config file (console/core/config_file.py)."""

    stale_metrics_s: float = 120.0  # no metrics record for this long while the trainer lives
    startup_grace_s: float = 600.0  # ... before the first record of a run (a big target loads slowly)
    start_find_s: float = (
        15.0  # a fresh `started` record, its process not found yet: not an exit for this long
    )
    tok_s_ratio: float = 0.5  # tok/s under this share of its median ...
    tok_s_window_s: float = 600.0  # ... over this window ...
    tok_s_low_s: float = 60.0  # ... for this long
    tok_s_min_history_s: float = 300.0  # no median before this much history
    tok_s_smooth_s: float = 10.0  # tok/s is the mean over this much record time (as on screen)
    checkpoint_factor: float = 2.0  # newest checkpoint older than this many save intervals
    disk_factor: float = 2.0  # free space under this many times the last checkpoint's size
    gpu_mem_pct: float = 97.0
    gpu_temp_c: float = 87.0  # the slowdown threshold (nvidia-smi -q -d TEMPERATURE: "GPU Slowdown Temp")
    accept_drop: float = 0.2  # real acceptance this share below its best
    served_drop: float = 0.15  # served acceptance this share below the last evaluation's: a warning
    served_min_drafts: float = 50.0  # ... judged over at least this many drafts
    job_left_s: float = 1800.0  # a scheduler job (Slurm) with less time left than this before its limit
    code_note: bool = True
    bell: bool = True  # ring the terminal bell when an alert starts
    desktop: bool = False  # a desktop notification (OSC 777 / OSC 9) when an alert starts


@dataclass
class Alert:
    key: str  # the rule, plus what it is about: "gpu_mem:0"
    rule: str
    level: str
    message: str
    since: float  # local clock: when it started
    level_since: float  # ... when it reached its current level
    acked: bool = False
    cleared: float | None = None


@dataclass
class Change:
    kind: str  # started | escalated | cleared
    alert: Alert


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1 :]
    return None


def save_interval(run: dict | None) -> tuple[int | None, float | None]:
    """(steps, seconds) of the trainer's periodic save, from run.json's argv (``--save-every N``,
    ``--save-every-minutes M``); None where not set or 0."""
    argv = run.get("argv") if isinstance(run, dict) else None
    if not isinstance(argv, list):
        return None, None
    argv = [str(a) for a in argv]
    steps = minutes = None
    try:
        v = _flag(argv, "--save-every")
        steps = int(v) if v is not None and int(v) > 0 else None
    except ValueError:
        pass
    try:
        v = _flag(argv, "--save-every-minutes")
        minutes = float(v) * 60 if v is not None and float(v) > 0 else None
    except ValueError:
        pass
    return steps, minutes


_KEY = re.compile(r"^[0-9a-f]{16}$")


def deploy_key(run: dict | None) -> str | None:
    """The deploy key (the code dir's name under .dflash-console/code/) of a run, if it ran deployed code."""
    code = run.get("code_dir") if isinstance(run, dict) else None
    if not isinstance(code, str):
        return None
    name = posixpath.basename(code.rstrip("/"))
    return name if _KEY.match(name) and "/.dflash-console/code/" in code + "/" else None


@dataclass
class _Facts:
    """What the rules read, folded from events."""

    trainer_alive: bool | None = None  # None: not known yet
    trainer_pid: int | None = None
    run: dict | None = None
    exit_seen_at: float | None = None  # local clock: the live trainer went away
    looked_at: float | None = None  # local clock: the session's newest word on the trainer (found or not)
    started: bool = False  # a `started` record of the current run was seen
    start_rec_t: float | None = None
    start_recv: float | None = None  # local clock: when the `started` record arrived
    start_step: int | None = None
    stop_requested: bool = False  # stop_requested record, or this console's signal
    stopped: dict | None = None  # the `stopped` record after the last `started`
    last_rec_t: float | None = None  # record time of the newest record
    last_recv: float | None = None  # local clock when the newest step/throughput arrived
    got_data: bool = False  # a step or throughput since the last `started`
    found_at: float | None = None  # local clock: the trainer was found
    step: int | None = None
    loss_bad: float | None = None  # the non-finite loss of the newest step (None: fine)
    nan_skipped_step: int | None = None  # a nan_skipped with no finite step after it
    saving: bool = False
    ckpt_step: int | None = None
    ckpt_rec_t: float | None = None
    ckpt_bytes: int | None = None
    gpus: list = field(default_factory=list)
    disk: DiskInfo | None = None
    accept_best: float | None = None
    accept_last: float | None = None
    accept_step: int | None = None
    job: JobState | None = None  # the place's scheduler job, as last polled (its ``t``: the local clock)
    served: ServedState | None = None  # the serving endpoint's acceptance, as last polled


class Health:
    """Folds events, evaluates rules, keeps the alerts (active and past) and acknowledgements."""

    def __init__(
        self,
        config: HealthConfig | None = None,
        clock: Callable[[], float] = time.time,
        bundled_key: str | None = None,
        history: int = 200,
    ) -> None:
        self.config = config or HealthConfig()
        self.clock = clock
        self.bundled_key = bundled_key
        self.f = _Facts()
        self.active: dict[str, Alert] = {}
        self.past: deque[Alert] = deque(maxlen=history)
        self.version = 0
        self._tp: deque[tuple[float, float]] = deque()  # (record t, drafters' tok/s) in the smoothing window
        self._tok: deque[tuple[float, float]] = deque()  # (record t, smoothed tok/s) over the median window
        self._median: float | None = None
        self._low_since: float | None = None  # record time the smoothed tok/s went low
        self._low_since_local: float | None = None
        self._quiet_until: float | None = None  # record time: no tok/s judgement until then (after a save)
        self._recv: float | None = None

    # ---- folding ------------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        match event:
            case Record():
                self.apply_record(event.record)
            case TrainerFound():
                self._on_trainer(event)
            case GpuSample():
                self.f.gpus = list(event.gpus)
            case DiskInfo():
                self.f.disk = event
            case JobState():
                self.f.job = event
            case ServedState():
                self.f.served = event
            case ActionPhase():
                if StopPhase.of(event.phase) in SIGNALLED:
                    self.f.stop_requested = True

    def apply_all(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.apply(ev)

    def _on_trainer(self, ev: TrainerFound) -> None:
        f, tr, now = self.f, ev.trainer, self.clock()
        f.looked_at = now
        if tr is not None:
            if f.trainer_pid != tr.pid or not f.trainer_alive:
                f.found_at = now
            f.trainer_alive, f.trainer_pid, f.exit_seen_at = True, tr.pid, None
            if isinstance(tr.run, dict):
                f.run = tr.run
        else:
            if f.trainer_alive:
                f.exit_seen_at = now
            f.trainer_alive = False

    def apply_record(self, rec: dict, recv: float | None = None) -> None:
        """Fold one metrics.jsonl record; ``recv`` is when it arrived (default: now; a one-shot check
        that reads history passes the record's own time)."""
        self._recv = recv
        f, kind, t = self.f, rec.get("kind"), number(rec.get("t"))
        if t is not None:
            f.last_rec_t = t if f.last_rec_t is None else max(f.last_rec_t, t)
        if kind == "step":
            self._on_step(rec)
        elif kind == "throughput":
            self._on_throughput(rec, t)
        elif kind == "event":
            self._on_event(rec, t)
        elif kind == "eval":
            v = number(rec.get("accept_len"))  # the eval record's field (docs/run-directory.md)
            if v is not None and math.isfinite(v):
                f.accept_last = v
                f.accept_best = v if f.accept_best is None else max(f.accept_best, v)
                f.accept_step = rec.get("step") if isinstance(rec.get("step"), int) else None

    def _data(self) -> None:
        self.f.got_data = True
        self.f.last_recv = self.clock() if self._recv is None else self._recv

    def _on_step(self, rec: dict) -> None:
        f = self.f
        self._data()
        step = rec.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            f.step = step
        if "loss" in rec:
            loss = rec.get("loss")
            bad = loss is None or (number(loss) is not None and not math.isfinite(loss))
            f.loss_bad = (loss if loss is not None else float("nan")) if bad else None
            if not bad:
                f.nan_skipped_step = None

    def _on_throughput(self, rec: dict, t: float | None) -> None:
        self._data()
        if t is None:
            return
        c = self.config
        tok = sum(
            number(d.get("tok_s")) or 0.0
            for d in rec.get("devices") or []
            if isinstance(d, dict) and d.get("role") == "drafter"
        )
        self._tp.append((t, tok))
        while self._tp and t - self._tp[0][0] > c.tok_s_smooth_s:
            self._tp.popleft()
        smooth = sum(v for _, v in self._tp) / len(self._tp)
        f = self.f
        if f.saving or f.stop_requested or (self._quiet_until is not None and t < self._quiet_until):
            self._low_since = self._low_since_local = None
            return
        self._tok.append((t, smooth))
        while self._tok and t - self._tok[0][0] > c.tok_s_window_s:
            self._tok.popleft()
        span = self._tok[-1][0] - self._tok[0][0]
        self._median = statistics.median(v for _, v in self._tok) if span >= c.tok_s_min_history_s else None
        if self._median and smooth < c.tok_s_ratio * self._median:
            if self._low_since is None:
                self._low_since, self._low_since_local = t, self.clock()
        else:
            self._low_since = self._low_since_local = None

    def _on_event(self, rec: dict, t: float | None) -> None:
        f, name = self.f, rec.get("name")
        if name == "started":
            f.started, f.start_rec_t, f.stopped, f.stop_requested = True, t, None, False
            f.start_recv = self.clock() if self._recv is None else self._recv
            f.got_data, f.saving, f.loss_bad, f.nan_skipped_step = False, False, None, None
            f.start_step = rec.get("step") if isinstance(rec.get("step"), int) else None
            f.ckpt_step = f.ckpt_rec_t = None
            self._tp.clear()
            self._tok.clear()
            self._median = self._low_since = self._low_since_local = self._quiet_until = None
        elif name == "stop_requested":
            f.stop_requested = True
        elif name == "stopped":
            f.stopped = rec
        elif name == "checkpoint_saving":
            f.saving = True
        elif name == "checkpoint_saved":
            f.saving = False
            if t is not None:  # tok/s is a window mean: the save's idle time leaves it for a while
                self._quiet_until = t + self.config.tok_s_smooth_s
            step = rec.get("step")
            f.ckpt_step = step if isinstance(step, int) else f.ckpt_step
            f.ckpt_rec_t = t
            b = rec.get("bytes")
            if isinstance(b, int) and b > 0:
                f.ckpt_bytes = b
        elif name == "nan_skipped":
            step = rec.get("step")
            f.nan_skipped_step = step if isinstance(step, int) else -1

    # ---- rules ---------------------------------------------------------------------------------

    def _input(self, now: float) -> RuleInput:
        tok = TokS(
            self._median, self._low_since, self._low_since_local, self._tok[-1][1] if self._tok else 0.0
        )
        return RuleInput(self.config, self.f, now, self.bundled_key, tok)

    # ---- alerts ----------------------------------------------------------------------------------

    def evaluate(self) -> list[Change]:
        """Run every rule now; start, escalate, update and clear alerts; return what changed."""
        now = self.clock()
        changes: list[Change] = []
        seen: set[str] = set()
        r = self._input(now)
        for fired in (x for rule in RULES for x in rule(r)):
            seen.add(fired.key)
            a = self.active.get(fired.key)
            if a is None:
                start = min(now, fired.since) if fired.since is not None else now
                a = Alert(fired.key, fired.rule, fired.level, fired.message, start, start)
                self.active[fired.key] = a
                changes.append(Change("started", a))
            else:
                if RANK[fired.level] > RANK[a.level]:
                    a.level_since = now
                    a.acked = False  # worse than what was acknowledged
                    changes.append(Change("escalated", a))
                elif fired.level != a.level:
                    a.level_since = now
                a.level, a.message = fired.level, fired.message
        for key in [k for k in self.active if k not in seen]:
            a = self.active.pop(key)
            a.cleared = now
            self.past.append(a)
            changes.append(Change("cleared", a))
        if changes:
            self.version += 1
        return changes

    def acknowledge(self, key: str) -> bool:
        """Silence an active alert until it clears (or gets worse); False if it is not active."""
        a = self.active.get(key)
        if a is None or a.acked:
            return False
        a.acked = True
        self.version += 1
        return True

    def alerts(self) -> list[Alert]:
        """Active alerts, worst and oldest first."""
        return sorted(self.active.values(), key=lambda a: (-RANK[a.level], a.since, a.key))

    def level(self, include_acked: bool = True) -> str:
        """The worst active level (``ok`` when none)."""
        levels = [a.level for a in self.active.values() if include_acked or not a.acked]
        return max(levels, key=RANK.__getitem__, default=OK)


# ---- the rules: each a function of what Health folded, yielding the conditions that hold now ----------


@dataclass(frozen=True)
class Firing:
    """A condition a rule finds holding now; :meth:`Health.evaluate` starts, updates or keeps its
    :class:`Alert` (and clears the alerts no rule fired)."""

    key: str  # the rule, plus what it is about: "gpu_mem:0"
    rule: str
    level: str
    message: str
    since: float | None = None  # local clock: when it began holding (None: now)


@dataclass(frozen=True)
class TokS:
    """The drafters' tok/s as Health follows it (the ``tok_s_drop`` rule's input)."""

    median: float | None  # over the median window (None: not enough history)
    low_since: float | None  # record time the smoothed tok/s went under the ratio
    low_since_local: float | None  # ... the local clock then
    current: float  # the newest smoothed tok/s


@dataclass(frozen=True)
class RuleInput:
    config: HealthConfig
    f: _Facts
    now: float  # the injected clock
    bundled_key: str | None  # the bundled trainer's deploy key
    tok: TokS


Rule = Callable[[RuleInput], Iterator[Firing]]


def trainer_exit(r: RuleInput) -> Iterator[Firing]:
    """The trainer exited without a stop request. A fresh start whose process the session has not looked
    for since its record arrived is not an exit: a relaunch's `started` can come before its process is
    found (it rang for a tick); a one-shot check looks first and reads the records after, so there a dead
    trainer still counts at once. No grace wait: the session delivers metrics.jsonl to its end before it
    reports the exit (Session._trainer_exited), so a `stopped` record the trainer wrote is already here."""
    c, f, now = r.config, r.f, r.now
    new_start_unseen = (
        f.stopped is None
        and f.start_rec_t is not None
        and f.start_recv is not None
        and now - f.start_rec_t < c.start_find_s
        and (f.looked_at is None or f.looked_at < f.start_recv)
    )
    if f.trainer_alive is not False or not f.started or f.stop_requested or new_start_unseen:
        return
    reason = (f.stopped or {}).get("reason")
    if reason in ("finished", "signal"):
        return
    if f.stopped is not None:
        what = f"trainer stopped: {reason} (exit {f.stopped.get('exit_code')})"
    else:
        what = "trainer exited without a stop request (killed or crashed)"
    yield Firing("trainer_exit", "trainer_exit", CRITICAL, what, f.exit_seen_at)


def nan_loss(r: RuleInput) -> Iterator[Firing]:
    """The newest loss is NaN/inf, or a step was skipped for one after the last finite loss."""
    f = r.f
    if f.loss_bad is not None:
        yield Firing("nan_loss", "nan_loss", CRITICAL, f"loss is {f.loss_bad} at step {f.step}")
    elif f.nan_skipped_step is not None:
        yield Firing("nan_loss", "nan_loss", CRITICAL, f"non-finite loss: step {f.nan_skipped_step} skipped")


def stale_metrics(r: RuleInput) -> Iterator[Firing]:
    """No metrics while the process lives (not while a checkpoint is saved; a longer grace at start)."""
    c, f, now = r.config, r.f, r.now
    if f.trainer_alive is not True:
        return
    if f.got_data and f.last_recv is not None and not f.saving:
        quiet = now - f.last_recv
        if quiet >= c.stale_metrics_s:
            yield Firing(
                "stale_metrics",
                "stale_metrics",
                WARNING,
                f"no metrics for {fmt_duration(quiet)} while the trainer (PID {f.trainer_pid}) runs",
                f.last_recv + c.stale_metrics_s,
            )
    elif not f.got_data and f.found_at is not None and now - f.found_at >= c.startup_grace_s:
        yield Firing(
            "stale_metrics",
            "stale_metrics",
            WARNING,
            f"no metrics for {fmt_duration(now - f.found_at)} since the trainer was found",
            f.found_at + c.startup_grace_s,
        )


def tok_s_drop(r: RuleInput) -> Iterator[Firing]:
    """The drafters' tok/s well under its median for a while (record time)."""
    c, f, tok = r.config, r.f, r.tok
    if f.trainer_alive is not True or tok.low_since is None or not tok.median or f.last_rec_t is None:
        return
    low_for = f.last_rec_t - tok.low_since
    if low_for >= c.tok_s_low_s:
        yield Firing(
            "tok_s_drop",
            "tok_s_drop",
            WARNING,
            f"tok/s {tok.current:,.0f} under {c.tok_s_ratio:.0%} of its "
            f"{fmt_duration(c.tok_s_window_s)} median {tok.median:,.0f} for {fmt_duration(low_for)}",
            tok.low_since_local,
        )


def checkpoint_age(r: RuleInput) -> Iterator[Firing]:
    """The newest checkpoint (the later of checkpoint_saved and the disk's `latest`) is more than
    ``checkpoint_factor`` save intervals (``--save-every`` steps, or ``--save-every-minutes``) old."""
    c, f = r.config, r.f
    if f.trainer_alive is not True or f.saving or f.stop_requested:
        return
    steps, secs = save_interval(f.run)
    d = f.disk
    ck_step = f.ckpt_step
    if d is not None and d.latest_step is not None and (ck_step is None or d.latest_step > ck_step):
        ck_step = d.latest_step
    base_step = ck_step if ck_step is not None else f.start_step
    if steps and base_step is not None and f.step is not None:
        behind = f.step - base_step
        if behind > c.checkpoint_factor * steps:
            what = f"newest checkpoint is step {ck_step}" if ck_step is not None else "no checkpoint yet"
            msg = f"{what}, {behind} steps ago (saves every {steps} steps)"
            yield Firing("checkpoint_age", "checkpoint_age", WARNING, msg)
            return
    if secs and f.last_rec_t is not None:
        base_t = f.ckpt_rec_t if f.ckpt_rec_t is not None else f.start_rec_t
        if base_t is not None and f.last_rec_t - base_t > c.checkpoint_factor * secs:
            msg = (
                f"newest checkpoint is {fmt_duration(f.last_rec_t - base_t)} old "
                f"(saves every {fmt_duration(secs)})"
            )
            yield Firing("checkpoint_age", "checkpoint_age", WARNING, msg)


def disk_free(r: RuleInput) -> Iterator[Firing]:
    """Free space on the run directory's filesystem under ``disk_factor`` checkpoints (critical under one)."""
    c, f = r.config, r.f
    d = f.disk
    size = f.ckpt_bytes or (d.last_checkpoint_bytes if d is not None else None)
    if d is not None and d.free_bytes is not None and size and d.free_bytes < c.disk_factor * size:
        yield Firing(
            "disk_free",
            "disk_free",
            CRITICAL if d.free_bytes < size else WARNING,
            f"{fmt_bytes(d.free_bytes)} free on the run directory's filesystem, "
            f"a checkpoint takes {fmt_bytes(size)}",
        )


def gpu_mem(g: Gpu, c: HealthConfig) -> Firing | None:
    if g.mem_used is None or not g.mem_total:
        return None
    percent = 100.0 * g.mem_used / g.mem_total
    if percent <= c.gpu_mem_pct:
        return None
    return Firing(f"gpu_mem:{g.index}", "gpu_mem", WARNING, f"GPU {g.index} memory {percent:.1f}%")


def gpu_temp(g: Gpu, c: HealthConfig) -> Firing | None:
    if g.temp is None or g.temp < c.gpu_temp_c:
        return None
    msg = f"GPU {g.index} at {g.temp:.0f} C (slowdown at {c.gpu_temp_c:.0f} C)"
    return Firing(f"gpu_temp:{g.index}", "gpu_temp", WARNING, msg)


GPU_RULES: list[Callable[[Gpu, HealthConfig], Firing | None]] = [gpu_mem, gpu_temp]


def gpus(r: RuleInput) -> Iterator[Firing]:
    """Each GPU's rules (memory, temperature), GPU by GPU."""
    for g in r.f.gpus:
        for rule in GPU_RULES:
            fired = rule(g, r.config)
            if fired is not None:
                yield fired


def accept_drop(r: RuleInput) -> Iterator[Firing]:
    """The newest eval's real acceptance ``accept_drop`` or more below its best."""
    c, f = r.config, r.f
    if f.accept_best and f.accept_last is not None and f.accept_last < (1 - c.accept_drop) * f.accept_best:
        yield Firing(
            "accept_drop",
            "accept_drop",
            WARNING,
            f"real acceptance {f.accept_last:.2f} (step {f.accept_step}) is "
            f"{1 - f.accept_last / f.accept_best:.0%} below its best {f.accept_best:.2f}",
        )


def code_differs(r: RuleInput) -> Iterator[Firing]:
    """A note: the running trainer's deployed code is not the bundled trainer's."""
    key = deploy_key(r.f.run)
    if r.config.code_note and r.f.trainer_alive is True and r.bundled_key and key and key != r.bundled_key:
        yield Firing(
            "code_differs",
            "code_differs",
            NOTE,
            f"the trainer runs code {key}; the bundled trainer is {r.bundled_key} (deploy to update)",
        )


def job_time_left(r: RuleInput) -> Iterator[Firing]:
    """The place's scheduler job (Slurm) nears its time limit while the trainer runs: at the limit the
    scheduler kills it (a launch from the console asks for SIGINT 120 s before, so it saves first)."""
    job, c = r.f.job, r.config
    if job is None or not job.job or job.left_s is None or job.state != "RUNNING":
        return
    left = job.left_s - max(0.0, r.now - job.t)
    if left < c.job_left_s:
        level = CRITICAL if left < 300 else WARNING
        yield Firing(
            "job_time_left",
            "job_time_left",
            level,
            f"job {job.job} has {fmt_duration(max(0.0, left))} left before its time limit",
        )


def served_shortfall(served_al: float, eval_al: float, drop: float) -> tuple[str, float]:
    """(level, share below): the one judgement of the screen's alert and ``serve-status``: WARNING when the
    served acceptance is more than ``drop`` below the evaluation's, CRITICAL when more than twice that."""
    below = 1 - served_al / eval_al if eval_al > 0 else 0.0
    return (CRITICAL if below > 2 * drop else WARNING if below > drop else OK), below


def served_below_eval(r: RuleInput) -> Iterator[Firing]:
    """The server's acceptance of the drafter it serves is well below what the trainer's own evaluation
    measured: the served drafter is another (an older export), or it is served otherwise than it was trained
    (the chat template, the target-layer ids, a server defect: docs/serving.md)."""
    s, f, c = r.f.served, r.f, r.config
    if s is None or s.accept_length is None or s.drafts < c.served_min_drafts or not f.accept_last:
        return
    level, below = served_shortfall(s.accept_length, f.accept_last, c.served_drop)
    if level != OK:
        over = "since the server started" if s.lifetime else f"over {fmt_duration(s.window_s)}"
        yield Firing(
            "served_below_eval",
            "served_below_eval",
            level,
            f"served acceptance {s.accept_length:.2f} ({s.endpoint}, {over}) is "
            f"{below:.0%} below the evaluation's {f.accept_last:.2f} (step "
            f"{f.accept_step}): is this run's drafter served, and served as trained?",
        )


# every rule, in the order evaluate() reports what changed
RULES: list[Rule] = [
    trainer_exit,
    nan_loss,
    stale_metrics,
    tok_s_drop,
    checkpoint_age,
    disk_free,
    gpus,
    accept_drop,
    code_differs,
    job_time_left,
    served_below_eval,
]
