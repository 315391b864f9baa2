"""What a :class:`~console.core.session.Session` tells its subscribers (plain dataclasses).

The screen's view model (state.py) dispatches on the class names, so keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
class StopPhase:
    phase: str  # 'verifying'|'signal_sent'|'saving'|'saved'|'exited'|'timeout'|'refused'|'error'
    detail: str = ""
    expected_s: float | None = None
    t: float = 0.0  # unix time of the phase


@dataclass
class StopResult:
    """Outcome of stop/restart/launch: ``code`` is the CLI exit code (0, 1, 3, 4, 5, 6)."""

    code: int
    message: str
    trainer: TrainerInfo | None = None
    checkpoint: str | None = None
