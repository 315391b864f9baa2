"""bench/bench_rollback.py with the static engine alone on the CPU (no cache pass; its own greedy output is the
reference, every speculative run reproduces it, progress lines as it goes)."""

from __future__ import annotations

import json

from tests.support.trainer_run import run_script as _run


def test_rollback_bench_with_the_static_engine_alone(tmp_path):
    out = tmp_path / "rb.json"
    r = _run("bench/bench_rollback.py", "--shapes", "tiny", "--engines", "static", "--prompts", "2", "--new",
             "24", "--repeats", "1", "--drafter-layers", "1", "--out", str(out))  # fmt: skip
    row = json.loads(out.read_text())["rows"][0]
    assert row["reference"] == "static" and "target_tok_s" not in row and row["target_tok_s_static"] > 0
    for right in (1, 3):
        assert row[f"right{right}_static"]["greedy_match"] is True
        assert row[f"right{right}_static"]["accept_len"] == right + 1
    assert "static target-only: warming up" in r.stderr and "accept 4.00 static" in r.stderr
