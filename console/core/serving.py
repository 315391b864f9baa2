"""Served acceptance: what a vLLM or SGLang server reports of the drafter it serves (docs/serving.md).

An :class:`Endpoint` is a port on the loopback of the place the trainer lives in (``vllm:8000``,
``sglang:30000``): the helper fetches its ``/metrics`` there, so no new network path is opened. vLLM
exposes counters (``vllm:spec_decode_num_drafts``, ``..._num_accepted_tokens``, ``..._per_pos`` by
position, requests, generated tokens): the served acceptance length over a window is ``1 + Δaccepted /
Δdrafts`` and position ``k``'s rate ``Δaccepted_k / Δdrafts``. SGLang exposes a gauge
(``sglang:spec_accept_length``, its most recent value): the figure is its mean over the window's samples.
Parsing is bounded: a body over the helper's limit is refused there, lines past :data:`MAX_LINES` ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

KINDS = ("vllm", "sglang")
MAX_LINES = 200_000
MAX_POSITIONS = 64
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]{0,2000}\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d{1,3})"')


THINKING = ("on", "off")


class EndpointError(ValueError):
    """A serving endpoint given wrongly (said as one line, exit 2)."""


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "vllm" | "sglang"
    port: int
    host: str = "127.0.0.1"
    path: str = "/metrics"
    thinking: str | None = None  # "on" | "off": whether it renders prompts with thinking (serve_check.py)

    def __str__(self) -> str:
        return f"{self.kind}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``vllm:8000`` / ``sglang:30000`` (optionally ``KIND:HOST:PORT`` with a loopback HOST): a port on the
    loopback of the place the trainer lives in."""
    kind, _, rest = str(text).strip().partition(":")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if kind not in KINDS or not port.isdigit() or not 0 < int(port) < 65536:
        raise EndpointError(f"serving endpoint {text!r}: give KIND:PORT, KIND one of {', '.join(KINDS)}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise EndpointError(
            f"serving endpoint {text!r}: a port on the place's loopback only (127.0.0.1, localhost, ::1): "
            "the console reaches it through the helper, never over a new network path"
        )
    return Endpoint(kind, int(port), host)


def with_thinking(endpoint: Endpoint | None, thinking: str | None) -> Endpoint | None:
    """``endpoint`` with its thinking setting (``serve_thinking``), which needs an endpoint."""
    if thinking is None:
        return endpoint
    if thinking not in THINKING:
        raise EndpointError(f"serve_thinking {thinking!r}: on or off")
    if endpoint is None:
        raise EndpointError("serve_thinking needs serve (KIND:PORT): the server it is the setting of")
    return dataclasses.replace(endpoint, thinking=thinking)


@dataclass(frozen=True)
class Counters:
    """One ``/metrics`` sample: the sums of the series we read (every label set added up)."""

    t: float
    drafts: float | None = None
    accepted: float | None = None
    per_pos: tuple[float, ...] = ()
    requests: float | None = None
    tokens: float | None = None
    accept_length: float | None = None  # SGLang's gauge


_VLLM = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:request_success": "requests",
    "vllm:generation_tokens": "tokens",
}
_SGLANG = {
    "sglang:spec_accept_length": "accept_length",
    "sglang:num_requests": "requests",
    "sglang:generation_tokens": "tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def parse_metrics(text: str, t: float) -> Counters:
    """The counters of a Prometheus text body (``_total`` suffixes as counters are exposed); bounded."""
    sums: dict[str, float] = {}
    pos: dict[int, float] = {}
    for line in text.splitlines()[:MAX_LINES]:
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, raw = m.group(1).removesuffix("_total"), m.group(2) or "", m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        if name == _PER_POS:
            p = _POSITION.search(labels)
            if p and int(p.group(1)) < MAX_POSITIONS:
                pos[int(p.group(1))] = pos.get(int(p.group(1)), 0.0) + value
        elif name in _VLLM or name in _SGLANG:
            key = _VLLM.get(name) or _SGLANG[name]
            sums[key] = sums.get(key, 0.0) + value
    per_pos = tuple(pos.get(i, 0.0) for i in range(max(pos) + 1)) if pos else ()
    return Counters(t, per_pos=per_pos, **sums)


@dataclass(frozen=True)
class Served:
    """The served figure over a window: acceptance length, per-position acceptance, request and token rates;
    ``lifetime`` when it is the server's totals since it started (one sample, or nothing drafted since)."""

    kind: str
    accept_length: float | None
    per_pos: tuple[float, ...] = ()
    drafts: float = 0.0
    req_per_s: float | None = None
    tok_per_s: float | None = None
    window_s: float = 0.0
    lifetime: bool = False
    t: float = 0.0
    error: str | None = None


def _rate(a: float | None, b: float | None, dt: float) -> float | None:
    return (b - a) / dt if a is not None and b is not None and dt > 0 and b >= a else None


def served(kind: str, samples: list[Counters]) -> Served:
    """The figure from ``samples`` (oldest first): deltas between the first and the last, else the last's
    totals (``lifetime``); a counter that went down (a restarted server) starts the window again."""
    if not samples:
        return Served(kind, None, error="no sample yet")
    last = samples[-1]
    if kind == "sglang":
        values = [s.accept_length for s in samples if s.accept_length is not None]
        first = samples[0]
        dt = last.t - first.t
        mean = sum(values) / len(values) if values else None
        return Served(
            kind, mean, (), 0.0, _rate(first.requests, last.requests, dt), _rate(first.tokens, last.tokens, dt),
            dt, len(samples) < 2, last.t,
        )  # fmt: skip
    first = next((s for s in samples if _same_run(s, last)), last)
    dt = last.t - first.t
    drafts = (last.drafts or 0.0) - (first.drafts or 0.0)
    if drafts <= 0:  # nothing drafted in the window: the server's totals
        first, dt, drafts = Counters(last.t), 0.0, last.drafts or 0.0
    if drafts <= 0:
        return Served(kind, None, error="nothing drafted yet", t=last.t)
    accepted = (last.accepted or 0.0) - (first.accepted or 0.0)
    per_pos = tuple(
        (v - (first.per_pos[i] if i < len(first.per_pos) else 0.0)) / drafts
        for i, v in enumerate(last.per_pos)
    )
    return Served(
        kind, 1.0 + accepted / drafts, per_pos, drafts, _rate(first.requests, last.requests, dt),
        _rate(first.tokens, last.tokens, dt), dt, dt == 0.0, last.t,
    )  # fmt: skip


def _same_run(s: Counters, last: Counters) -> bool:
    """``s`` precedes ``last`` on the same server run: no counter went down between them."""
    return (s.drafts or 0.0) <= (last.drafts or 0.0) and (s.accepted or 0.0) <= (last.accepted or 0.0)


@dataclass
class Window:
    """The samples of the last ``span_s`` seconds (the served figure's window)."""

    span_s: float = 60.0
    samples: list[Counters] = field(default_factory=list)

    def add(self, c: Counters) -> None:
        self.samples.append(c)
        while len(self.samples) > 2 and self.samples[1].t <= c.t - self.span_s:
            self.samples.pop(0)
