"""A role's tokens and busy time on a CUDA device, measured by CUDA events instead of host syncs.

``RoleMeter`` times a span on the host, which for GPU work means a stream sync at the end of every span:
the GPU then idles while the host launches the next one (about 6% of a drafter step on an H200). A
``GpuMeter`` records a timing event on the role's current stream at ``begin`` and ``end`` and never waits:
``take`` (the reporter thread) counts the spans whose events the GPU has passed. Tokens count when the GPU
has finished their span; busy time is the GPU time inside spans, placed on the host clock (one reference
event, re-anchored at every finished span so float32 milliseconds never lose precision) and split
between reporting intervals at their boundaries. Spans of two roles on one stream (one GPU, both roles)
overlap, so their busy fractions do too.
"""

from __future__ import annotations

import collections
import time

import torch

from trainer.run.rundir import RoleMeter

MAX_PENDING = 1024  # spans kept for ``take``; beyond, the finished ones are folded in at ``end``


class GpuMeter(RoleMeter):
    def __init__(self, device: str, role: str, uuid: str | None = None):
        super().__init__(device, role, uuid)
        self._spans: collections.deque = collections.deque()  # [start event, end event or None, tokens]
        self._ref: tuple[torch.cuda.Event, float] | None = None  # (an event the GPU passed, its host time)
        self._last: float | None = None  # host time of the last take

    def _event(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def begin(self) -> None:
        if self._ref is None:  # once: an event the host saw complete, the zero of the GPU-to-host clock map
            ev = self._event()
            ev.synchronize()
            with self._lock:
                self._ref = (ev, time.monotonic())
        start = self._event()
        with self._lock:
            self._spans.append([start, None, 0])

    def end(self, tokens: int) -> None:
        ev = self._event()
        with self._lock:
            if self._spans and self._spans[-1][1] is None:
                self._spans[-1][1], self._spans[-1][2] = ev, int(tokens)
            if len(self._spans) > MAX_PENDING:  # nobody takes (no reporter): fold the finished spans in now
                self._drain(time.monotonic(), running=False)

    def _host(self, ev: torch.cuda.Event) -> float:
        ref, t = self._ref
        return t + ref.elapsed_time(ev) / 1e3

    def _drain(self, now: float, running: bool) -> None:
        """Move the spans the GPU has finished into the totals (busy inside ``(self._last, now]``); with
        ``running``, also the running span's part so far. Under ``self._lock``."""
        lo = now if self._last is None else self._last
        with torch.cuda.device(self.device):
            while self._spans:
                start, end, n = self._spans[0]
                if not start.query():
                    break
                t0 = self._host(start)
                if end is None or not end.query():  # running: busy up to now, the rest next time
                    if running:
                        self._busy += max(0.0, now - max(t0, lo))
                    break
                t1 = self._host(end)
                self._busy += max(0.0, min(t1, now) - max(t0, lo))
                self._tokens += n
                self._spans.popleft()
                self._ref = (end, t1)

    def take(self, now: float) -> tuple[int, float]:
        with self._lock:
            if self._ref is not None:
                self._drain(now, running=True)
            self._last = now
            out = (self._tokens, self._busy)
            self._tokens, self._busy = 0, 0.0
        return out


def role_meter(device: str, role: str, uuid: str | None = None) -> RoleMeter:
    """The meter for a role on ``device``: ``GpuMeter`` on CUDA, the host-timed ``RoleMeter`` elsewhere."""
    return GpuMeter(device, role, uuid) if str(device).startswith("cuda") else RoleMeter(device, role, uuid)
