"""The commands that read a record (``connect --record``) instead of a host: ``replay``, ``status RECORD``,
``logs RECORD``."""

from __future__ import annotations

from console.cli_exit import EXIT_OK, EXIT_USAGE, err
from console.core import json_out


def cmd_replay(args) -> int:
    from console.core.record import RecordError, Streamed
    from console.tui.replay_app import ReplayApp

    try:
        rec = Streamed(args.file)  # the header now; the events as the replay reaches them
    except RecordError as e:
        err(str(e))
        return EXIT_USAGE
    if args.run is not None and not 1 <= args.run <= len(rec.runs):
        err(f"the record has {len(rec.runs)} run(s); --run {args.run} is not one")
        return EXIT_USAGE
    ReplayApp(rec, run=None if args.run is None else args.run - 1, speed=args.speed).run()
    for where in rec.bad_lines:  # found while replaying: said once the screen has the terminal back
        err(f"skipped {where}")
    return EXIT_OK


def is_record(path: str) -> bool:
    """A file on this machine that starts as gzip does: a record (status and logs read it)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _record_runs(path: str, fold) -> tuple[list[dict], object] | None:
    """Stream the record at ``path`` (bounded memory: one line at a time), calling ``fold(entry)`` for
    each event; (its runs, its reader) or None once a RecordError was said. Skipped lines are said
    on stderr with their file and line."""
    from console.core.record import Reader, RecordError

    try:
        with Reader(path) as r:
            for entry in r:
                fold(entry)
    except RecordError as e:
        err(str(e))
        return None
    for where in r.bad_lines:
        err(f"skipped {where}")
    if r.bad > len(r.bad_lines):
        err(
            f"skipped {r.bad - len(r.bad_lines)} more line(s) of {path} that are not events this console reads"
        )
    return r.header.get("runs") or [{"label": "run", "where": "?"}], r


def cmd_record_status(args, path: str) -> int:
    from console.core.fleet import row_line, state_row
    from console.core.state import ConsoleState

    now = [0.0]  # the record's time: the event being folded, then the last one (as the replay's clock)
    states: dict[int, ConsoleState] = {}

    def fold(e) -> None:
        now[0] = max(now[0], e.t)
        states.setdefault(e.run, ConsoleState(clock=lambda: now[0])).apply(e.event)

    got = _record_runs(path, fold)
    if got is None:
        return EXIT_USAGE
    runs, r = got
    rows = []
    for i, info in enumerate(runs):
        st = states.get(i) or ConsoleState(clock=lambda: now[0])
        rows.append(state_row(i, info.get("label", f"run {i + 1}"), info.get("where", "?"), st))
    if args.json:
        values = [row_json(r) for r in rows]
        print(json_out.dumps(values[0] if len(values) == 1 else values))
    else:
        for row in rows:
            print(row_line(row))
    for _t, text in r.notes:
        if text != "record closed":
            print(f"note: {text}")
    return EXIT_OK


# the overview's column labels (console/core/fleet.py) as JSON field names
ROW_FIELDS = {"#": "index", "run": "label", "host / CT": "where", "tok/s": "tok_s", "accept": "accept_len"}


def row_json(row: dict) -> dict:
    """A record's row for ``status RECORD --json``: field names as keys, the queue as depth/capacity,
    the checkpoint's age in seconds before the record's end."""
    out = {ROW_FIELDS.get(k, k): v for k, v in row.items() if k not in ("queue", "ckpt")}
    depth, capacity = row.get("queue") or (None, None)
    out["queue"] = {"depth": depth, "capacity": capacity}
    out["checkpoint_age_s"] = row.get("ckpt")
    return out


def cmd_record_logs(args, path: str) -> int:
    from collections import defaultdict, deque

    from console.core.events import LogLines

    keep = max(0, args.lines)
    tails: dict[int, deque[str]] = defaultdict(lambda: deque(maxlen=keep))

    def fold(e) -> None:
        if isinstance(e.event, LogLines) and keep:
            tails[e.run].extend(e.event.lines)

    got = _record_runs(path, fold)
    if got is None:
        return EXIT_USAGE
    runs, _ = got
    several = len(runs) > 1
    for i, info in enumerate(runs):
        prefix = f"[{info.get('label', i + 1)}] " if several else ""
        for ln in tails.get(i, ()):
            print(prefix + ln)
    return EXIT_OK
