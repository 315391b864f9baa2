"""The metrics.jsonl reader survives what a live, appended-to file gives it."""

import json

from console.core.metrics import MetricsParser, headline_tok_s, parse_line


def test_torn_line_is_held_until_complete():
    rec = {"t": 1.5, "kind": "step", "step": 3, "loss": 2.0}
    line = (json.dumps(rec) + "\n").encode()
    p = MetricsParser()
    assert p.feed(line[:10]) == []
    assert p.pending == line[:10]
    assert p.feed(line[10:]) == [rec]
    assert p.bad_lines == 0


def test_garbage_unknown_kinds_and_fields():
    p = MetricsParser()
    chunk = (
        b'not json\n{"kind": "future", "x": 1, "t": 2}\n[1,2]\n{"t": 3, "kind": "step", "new": {"a": 1}}\n\n'
    )
    out = p.feed(chunk)
    assert [r["kind"] for r in out] == ["future", "step"]
    assert out[1]["new"] == {"a": 1}
    assert p.bad_lines == 2


def test_bad_t_and_utf8():
    assert parse_line(b'{"kind": "event", "t": "soon"}')["t"] is None
    assert parse_line(b"\xff\xfe") is None
    assert parse_line("  ") is None


def test_headline_is_drafters_sum_only():
    tp = {
        "devices": [
            {"role": "target", "tok_s": 1000.0},
            {"role": "drafter", "tok_s": 300.0},
            {"role": "drafter", "tok_s": 200.0},
            {"role": "drafter", "tok_s": None},
        ]
    }
    assert headline_tok_s(tp) == 500.0
