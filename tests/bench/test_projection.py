"""bench/projection.py: every split of 8 GPUs from per-GPU stage rates and a measured efficiency."""

from __future__ import annotations

import json

from bench import projection


def test_every_split_is_the_slower_side_times_the_efficiency():
    p = projection.project(capture=11_738.0, drafter=35_487.0, efficiency=0.95, n=8)
    rows = {(r["target_gpus"], r["drafter_gpus"]): r for r in p["rows"]}
    assert sorted(rows) == [(t, 8 - t) for t in range(1, 8)]
    five = rows[(5, 3)]
    assert five["raw_tok_s"] == min(5 * 11_738.0, 3 * 35_487.0) == 58_690.0
    assert five["projected_tok_s"] == 58_690.0 * 0.95 and five["limited_by"] == "target"
    assert rows[(7, 1)]["limited_by"] == "drafter" and rows[(7, 1)]["raw_tok_s"] == 35_487.0
    # the rates favour 6 + 2 (6 x 11,738 = 70,428 < 2 x 35,487), and the launcher is told so
    assert p["best"] == {"target_gpus": 6, "drafter_gpus": 2}
    assert p["best_flags"] == "--target-gpus 0,1,2,3,4,5 --drafter-gpus 6,7"
    assert p["best_projected_tok_s"] == 70_428.0 * 0.95 and p["goal_met"]


def test_markdown_marks_the_best_split_and_the_goal(tmp_path, capsys):
    p = projection.project(capture=10_000.0, drafter=10_000.0, efficiency=0.5, n=8)
    md = projection.markdown(p, "test")
    best = [line for line in md.splitlines() if line.startswith("| **")]
    assert best == [
        "| **4 + 4** | 40,000 | 40,000 | target | **20,000** | `--target-gpus 0,1,2,3 --drafter-gpus 4,5,6,7` |"
    ]
    assert "goal >= 50,000 missed" in md
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"projection": p}))
    assert projection.main([str(results)]) == 0
    assert "| **4 + 4** |" in capsys.readouterr().out
    results.write_text(json.dumps({}))
    assert projection.main([str(results)]) == 1
