"""What a :class:`~console.core.session.Session` tells its subscribers (plain dataclasses), and
what its actions (stop, restart, launch) return."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


@dataclass
class ConnState:
    state: str  # 'connecting' | 'connected' | 'reconnecting' | 'disconnected'
    detail: str = ""
    retry_in: float | None = None


@dataclass
class Record:
    """One parsed metrics.jsonl record (see console/core/metrics.py)."""

    record: dict


@dataclass
class LogLines:
    lines: list[str]


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    util: float | None = None
    mem_used: float | None = None  # MiB
    mem_total: float | None = None  # MiB
    power: float | None = None  # W
    temp: float | None = None  # C


@dataclass
class GpuSample:
    gpus: list[Gpu] = field(default_factory=list)


@dataclass
class TelemetryState:
    available: bool
    detail: str = ""


@dataclass
class TrainerInfo:
    pid: int
    start_time: int  # /proc/PID/stat field 22
    cmdline: list[str]
    run_dir: str | None
    source: str  # 'run.json' | 'cmdline'
    run: dict | None = None  # run.json, when there is one


@dataclass
class TrainerFound:
    trainer: TrainerInfo | None


@dataclass
class ActionPhase:
    """A step of a stop, restart or launch as it happens: a stop's 'verifying' | 'signal_sent' |
    'saving' | 'saved' | 'exited' | 'timeout' | 'refused' | 'error', and 'reconnecting' |
    'reconnected' when the link drops during it; a restart's 'launching' | 'started' after them."""

    phase: str
    detail: str = ""
    expected_s: float | None = None
    t: float = 0.0  # unix time of the phase


@dataclass
class CheckpointEntry:
    """One ``checkpoints/step_*`` directory of the run (console/core/checkpoints.py)."""

    name: str
    path: str
    step: int | None
    bytes: int
    mtime: float | None
    complete: bool
    latest: bool = False
    export: str | None = None  # a serving export inside it
    refused: str | None = None  # why it is not offered (a linked step_* or export: the helper's words)


@dataclass
class DiskInfo:
    """The run directory's filesystem and checkpoints, polled through the helper at a modest rate."""

    run_dir: str
    free_bytes: int | None
    total_bytes: int | None
    checkpoints: list[CheckpointEntry] = field(default_factory=list)
    latest: str | None = None  # what checkpoints/latest names
    keep: int | None = None  # the trainer's --keep-checkpoints, when its flags say
    error: str | None = None
    t: float = 0.0

    @property
    def latest_entry(self) -> CheckpointEntry | None:
        return next((c for c in self.checkpoints if c.latest), None)

    @property
    def latest_step(self) -> int | None:
        e = self.latest_entry
        return e.step if e is not None else None

    @property
    def last_checkpoint_bytes(self) -> int | None:
        done = [c for c in self.checkpoints if c.complete and c.bytes > 0]
        return max(done, key=lambda c: c.step or 0).bytes if done else None


class Outcome(IntEnum):
    """How a stop, restart or launch ended. The CLI turns each into its exit code (console/cli.py);
    the values are those exit codes, so a result still compares equal to the documented number."""

    OK = 0
    ERROR = 1  # failed otherwise (a launch refused or crashed, the link dropped, ...)
    USAGE = 2  # asked wrongly (no run dir, --run-dir and --output-dir differ)
    STILL_RUNNING = 3  # the trainer was still running at the timeout (left running)
    NO_TRAINER = 4
    REFUSED = 5  # the PID is no longer that trainer, or it ignores SIGINT: nothing was signalled
    NO_CHECKPOINT = 6  # the trainer exited without a checkpoint_saved


@dataclass
class ActionResult:
    """What a stop, restart or launch came to: ``code`` says how it ended, ``trainer`` is the trainer
    it acted on (a launch's or restart's: the new one), ``checkpoint`` the path a stop saved."""

    code: Outcome
    message: str
    trainer: TrainerInfo | None = None
    checkpoint: str | None = None
    serve_check: object | None = None  # a launch's train/serve check (console/core/serve_check.py)


# Everything a session tells its subscribers.
@dataclass
class JobState:
    """The scheduler's word on the place's job (a Slurm job: console/core/places/slurm.py), polled through
    the helper; ``job`` "" when it shows none (``error`` when it could not be asked)."""

    job: str = ""
    state: str = ""
    reason: str = ""
    used_s: int | None = None
    left_s: int | None = None
    limit_s: int | None = None
    nodes: str = ""
    error: str | None = None
    t: float = 0.0  # local clock: when it was asked
    partition: str = ""
    position: int | None = None  # a pending job: its place among its partition's pending jobs, by priority
    queued: int | None = None  # ... of this many

    @classmethod
    def of(cls, state: dict | None, t: float) -> JobState:
        fields = {k: v for k, v in (state or {}).items() if k in cls.__dataclass_fields__}
        return cls(**fields, t=t)


@dataclass(frozen=True)
class ServedState:
    """A serving endpoint's word on the drafter it serves (console/core/serving.py), polled through the
    helper: the acceptance length over ``window_s`` (``lifetime``: the server's totals since it started)."""

    endpoint: str = ""  # "vllm:8000"
    accept_length: float | None = None
    per_pos: list[float] = field(default_factory=list)
    drafts: float = 0.0
    req_per_s: float | None = None
    tok_per_s: float | None = None
    window_s: float = 0.0
    lifetime: bool = False
    error: str | None = None
    t: float = 0.0  # local clock: when it was asked

    @classmethod
    def of(cls, endpoint: str, s) -> ServedState:
        """From a :class:`console.core.serving.Served`."""
        return cls(
            endpoint, s.accept_length, list(s.per_pos), s.drafts, s.req_per_s, s.tok_per_s, s.window_s,
            s.lifetime, s.error, s.t,
        )  # fmt: skip


Event = (
    ConnState
    | Record
    | LogLines
    | GpuSample
    | TelemetryState
    | TrainerFound
    | ActionPhase
    | DiskInfo
    | JobState
    | ServedState
)
