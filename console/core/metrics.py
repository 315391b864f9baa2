"""Parse the trainer's ``metrics.jsonl`` (the run-directory contract, docs/run-directory.md).

A reader must survive a torn last line (the writer may be mid-line when we read), lines that are
not JSON objects, unknown ``kind`` values and unknown fields. :class:`MetricsParser` takes raw byte
chunks as a tail delivers them and yields only complete, valid records; a partial last line is
kept until its newline arrives.
"""

from __future__ import annotations

from collections.abc import Iterator

from console.core.sanitize import BadJson, loads

MAX_RECORD = 1 << 20  # a longer line is not a record: skipped (counted in bad_lines), never buffered
# the contract's list and object fields (docs/run-directory.md): readers iterate them without checking
_CONTAINERS = {"devices": list, "queue": dict, "acc": list, "per_position": list, "histogram": list}


def parse_line(line: bytes | str) -> dict | None:
    """One line -> a record dict, or None when it is not a JSON object with a string ``kind``.

    Decoding is bounded and the text cleaned (console/core/sanitize.py: no escape sequence or control
    character of the container's reaches a terminal; a 100k-deep line is a bad line, not a
    RecursionError). Unknown kinds are returned as they are (callers ignore what they do not know);
    a missing or non-numeric ``t`` becomes None rather than an error.
    """
    if not line.strip():
        return None
    try:
        rec = loads(line, MAX_RECORD)
    except BadJson:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
        return None
    t = rec.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        rec["t"] = None
    for key, kind in _CONTAINERS.items():  # a list or object field of another type: as if absent
        if key in rec and not isinstance(rec[key], kind):
            del rec[key]
    return rec


class MetricsParser:
    """Incremental parser: feed byte chunks, get complete records back, in order.

    ``bad_lines`` counts complete lines that were not valid records (a torn line that is later
    completed is not counted: it was never complete), and lines over ``max_line`` bytes, which are
    dropped as they arrive (memory stays bounded).
    """

    def __init__(self, max_line: int = MAX_RECORD) -> None:
        self._buf = b""
        self._dropping = False  # inside an over-long line: dropped up to its newline
        self.max_line = max_line
        self.bad_lines = 0

    def feed(self, chunk: bytes) -> list[dict]:
        return list(self._iter(chunk))

    def _iter(self, chunk: bytes) -> Iterator[dict]:
        if self._dropping:
            nl = chunk.find(b"\n")
            if nl < 0:
                return
            chunk = chunk[nl + 1 :]
            self._dropping = False
        data = self._buf + chunk
        *lines, self._buf = data.split(b"\n")
        if len(self._buf) > self.max_line:  # no record is this long: skip it without keeping it
            self._buf = b""
            self._dropping = True
            self.bad_lines += 1
        for raw in lines:
            if not raw.strip():
                continue
            try:  # each record on its own: a bad one is skipped and counted, never the chunk
                rec = parse_line(raw) if len(raw) <= self.max_line else None
            except Exception:  # noqa: BLE001 - parse_line has no known raise left; stay safe
                rec = None
            if rec is None:
                self.bad_lines += 1
            else:
                yield rec

    @property
    def pending(self) -> bytes:
        """Bytes of an incomplete last line, not yet parsed."""
        return self._buf


TOK_S_WINDOW_S = 10.0  # the headline tok/s is a mean over this much record time (screen and status alike)


def headline_tok_s(throughput: dict) -> float:
    """The run's headline tok/s: the drafters' sum (context tokens trained), never target + drafter."""
    total = 0.0
    for dev in throughput.get("devices") or []:
        if isinstance(dev, dict) and dev.get("role") == "drafter":
            v = dev.get("tok_s")
            if isinstance(v, (int, float)):
                total += float(v)
    return total
