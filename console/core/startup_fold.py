"""A run's start-up, folded from its metrics.jsonl records: phase, target bytes read, and an estimate.

The trainer writes the ``started`` event, then ``startup`` records (``phase``: ``compile_cache``,
``building_drafter``, ``loading_target`` with ``bytes`` of ``total_bytes``, ``target_loaded``, ``compiling``
with ``part``, ``queue_filling``, at last ``first_step``; docs/run-directory.md). ``StartupFold.apply(record)`` folds them;
``view(now)`` says where the start is, ``line(now)`` says it in one line. The estimate of the time left to
the first step is the larger of: the target's bytes left at the rate read so far (while loading), and the
previous start of the same run (``expected_first_step_s`` of ``started``) less the time gone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from console.core.formatting import fmt_bytes, fmt_duration
from console.core.numeric import number

PHASE_TEXT = {
    "starting": "starting",
    "compile_cache": "compile cache",
    "building_drafter": "building the drafter",
    "loading_target": "loading the target",
    "target_loaded": "target loaded",
    "compiling": "compiling",
    "queue_filling": "waiting for the first hidden states",
}


@dataclass
class StartupView:
    active: bool  # started, no first step (nor stop) yet
    phase: str
    detail: str
    elapsed_s: float | None
    bytes: float | None = None
    total_bytes: float | None = None
    rate: float | None = None  # bytes/s of the target's read so far
    eta_s: float | None = None  # to the first step
    expected_s: float | None = None  # the previous start's launch-to-first-step
    first_step_s: float | None = None  # this start's, once it has trained
    cache: str | None = None  # the compile cache: warm / cold / stale / off

    def to_dict(self) -> dict:
        return asdict(self)


class StartupFold:
    def __init__(self) -> None:
        self.reset(None)
        self.seen = False

    def reset(self, t: float | None, expected: float | None = None) -> None:
        self.t0, self.expected = t, expected
        self.active = t is not None
        self.phase, self.detail = "starting", ""
        self.bytes = self.total = None
        self._load: tuple[float, float] | None = None  # (t, bytes) of the first progress record
        self._last_load: tuple[float, float] | None = None
        self.first_step_s: float | None = None
        self.cache: str | None = None
        self.last_elapsed: float | None = None

    def apply(self, rec: dict) -> bool:
        """Fold one record; True when it was a start-up record."""
        kind, t = rec.get("kind"), number(rec.get("t"))
        if kind == "step":  # it trains (a trainer from before start-up records never says first_step)
            if self.active:
                self.active = False
                if self.first_step_s is None and t is not None and self.t0 is not None:
                    self.first_step_s = max(0.0, t - self.t0)
            return False
        name = rec.get("name") if kind == "event" else None
        if kind == "startup":
            name = "first_step" if rec.get("phase") == "first_step" else "startup"
        elif kind != "event":
            return False
        if name == "started":
            self.reset(t, number(rec.get("expected_first_step_s")))
            self.seen = True
        elif name == "startup":
            if not self.seen:  # the tail began after `started`: count from this record's elapsed_s
                el = number(rec.get("elapsed_s"))
                self.reset(None if t is None or el is None else t - el)
                self.seen = True
            self._phase(rec, t)
        elif name == "first_step":
            if not self.seen:
                self.seen = True
            self.active = False
            self.first_step_s = number(rec.get("seconds"))
            self.expected = number(rec.get("expected_s")) if self.expected is None else self.expected
        elif name == "stopped":
            self.active = False
        else:
            return False
        return True

    def _phase(self, rec: dict, t: float | None) -> None:
        phase = rec.get("phase")
        if not isinstance(phase, str):
            return
        self.last_elapsed = number(rec.get("elapsed_s"))
        if phase == "compile_cache":
            self.cache = rec.get("state") if isinstance(rec.get("state"), str) else None
            if self.phase == "starting":
                self.detail = f"compile cache {self.cache}" if self.cache else ""
            return  # not a phase of its own: the cache is said beside the others
        self.phase = phase
        self.detail = ""
        if phase == "loading_target":
            b, tot = number(rec.get("bytes")), number(rec.get("total_bytes"))
            self.bytes, self.total = b, tot if tot else self.total
            if b is not None and t is not None:
                if self._load is None:
                    self._load = (t, b)
                self._last_load = (t, b)
        elif phase == "target_loaded":
            self.bytes = self.total = number(rec.get("bytes")) or self.total
        elif phase == "compiling":
            part = rec.get("part")
            self.detail = str(part) if isinstance(part, str) else ""
        elif phase == "queue_filling":
            pass

    def rate(self) -> float | None:
        if self._load is None or self._last_load is None:
            return None
        (t0, b0), (t1, b1) = self._load, self._last_load
        return (b1 - b0) / (t1 - t0) if t1 > t0 and b1 > b0 else None

    def view(self, now: float) -> StartupView | None:
        if not self.seen:
            return None
        elapsed = None if self.t0 is None else max(0.0, now - self.t0)
        if not self.active:
            elapsed = self.first_step_s if self.first_step_s is not None else elapsed
        rate = self.rate()
        eta = None
        if self.active:
            cands = []
            if self.expected is not None and elapsed is not None:
                cands.append(max(0.0, self.expected - elapsed))
            if self.phase == "loading_target" and rate and self.total and self.bytes is not None:
                cands.append(max(0.0, (self.total - self.bytes) / rate))
            eta = max(cands) if cands else None
        return StartupView(
            active=self.active,
            phase=self.phase if self.active else ("trained" if self.first_step_s is not None else "ended"),
            detail=self.detail,
            elapsed_s=elapsed,
            bytes=self.bytes,
            total_bytes=self.total,
            rate=rate,
            eta_s=eta,
            expected_s=self.expected,
            first_step_s=self.first_step_s,
            cache=self.cache,
        )


def fraction(v: StartupView) -> float | None:
    """How far the start is, 0..1, for a progress bar: by time against the estimate, else by bytes."""
    if not v.active:
        return 1.0 if v.first_step_s is not None else None
    if v.elapsed_s is not None and v.eta_s is not None and v.elapsed_s + v.eta_s > 0:
        return min(1.0, v.elapsed_s / (v.elapsed_s + v.eta_s))
    if v.phase == "loading_target" and v.total_bytes and v.bytes is not None:
        return min(1.0, v.bytes / v.total_bytes)
    return None


def line(v: StartupView) -> str:
    """One line: ``loading the target 120 MB of 16.4 GB (1.2 GB/s) · 12 s · first step in ~40 s (last start 65 s)``."""
    if not v.active:
        if v.first_step_s is None:
            return "start-up ended before the first step"
        s = f"first step {fmt_duration(v.first_step_s)} after launch"
        if v.expected_s is not None:
            s += f" (last start {fmt_duration(v.expected_s)})"
        return s + (f", compile cache {v.cache}" if v.cache else "")
    s = PHASE_TEXT.get(v.phase, v.phase.replace("_", " "))
    if v.detail:
        s += f" {v.detail}" if v.phase == "compiling" else f" ({v.detail})"
    if v.phase == "loading_target" and v.total_bytes:
        s += f" {fmt_bytes(v.bytes or 0)} of {fmt_bytes(v.total_bytes)}"
        if v.rate:
            s += f" ({fmt_bytes(v.rate)}/s)"
    if v.elapsed_s is not None:
        s += f" · {fmt_duration(v.elapsed_s)}"
    if v.eta_s is not None:
        s += f" · first step in ~{fmt_duration(v.eta_s)}"
    if v.expected_s is not None:
        s += f" (last start {fmt_duration(v.expected_s)})"
    if v.cache and v.phase != "starting":
        s += f" · cache {v.cache}"
    return s


class StartupPrinter:
    """``launch`` / ``restart`` output of the start-up: on a terminal one redrawn line with a bar (``tick``
    keeps its clock moving); otherwise a plain line per phase (and per ``PLAIN_EVERY_S`` of loading)."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, stream, clock) -> None:
        self.stream, self.clock = stream, clock
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.fold = StartupFold()
        self._said: tuple | None = None
        self._said_t = 0.0
        self.drawn = False

    def on_record(self, rec: dict) -> None:
        if not self.fold.apply(rec):
            return
        v = self.fold.view(self.clock())
        if v is None:
            return
        if self.tty:
            self.draw(v)
            if not v.active:
                self.end()
            return
        key = (v.phase, v.detail, v.active)
        now = self.clock()
        if key != self._said or now - self._said_t >= self.PLAIN_EVERY_S:
            self._said, self._said_t = key, now
            self.stream.write("start-up: " + line(v) + "\n")
            self.stream.flush()

    def bar(self, v: StartupView, width: int = 20) -> str:
        frac = fraction(v)
        if frac is None:
            return "[" + "?" * width + "]"
        n = round(frac * width)
        return "[" + "#" * n + "-" * (width - n) + f"] {frac * 100:3.0f}%"

    def draw(self, v: StartupView | None = None) -> None:
        v = v or self.fold.view(self.clock())
        if v is None or not self.tty:
            return
        self.stream.write("\r\x1b[2K" + self.bar(v) + " " + line(v))
        self.stream.flush()
        self.drawn = True

    def end(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False

    async def tick(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(0.5)
            v = self.fold.view(self.clock())
            if v is not None and v.active:
                self.draw(v)


def panel_parts(v: StartupView) -> tuple[str, str]:
    """The screen's two start-up rows: what it does (``loading the target 7.0/16.0 GB``), and when training
    starts (``in ~25s · 14s gone · last 39s``)."""
    what = PHASE_TEXT.get(v.phase, v.phase.replace("_", " "))
    if v.phase == "loading_target" and v.total_bytes:
        what = f"loading target {fmt_bytes(v.bytes or 0)}/{fmt_bytes(v.total_bytes)}"
    elif v.phase == "queue_filling":
        what = "waiting for hidden states"
    elif v.detail and v.phase == "compiling":
        what += f" {v.detail}"
    when = f"in ~{fmt_duration(v.eta_s)}" if v.eta_s is not None else "?"
    if v.elapsed_s is not None:
        when += f" · {fmt_duration(v.elapsed_s)} gone"
    if v.expected_s is not None:
        when += f" · last {fmt_duration(v.expected_s)}"
    return what, when
