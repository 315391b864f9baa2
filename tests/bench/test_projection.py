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


def test_fp8_projection_from_a_bench_hybrid_run(tmp_path, capsys):
    hybrid = tmp_path / "bench_hybrid.json"
    hybrid.write_text(
        json.dumps({"steps": {"direct_packed": {"tok_s": 12_000.0}, "fp8_packed": {"tok_s": 18_000.0}}})
    )
    assert projection.main(["--fp8", "--hybrid", str(hybrid), "--drafter", "30000"]) == 0
    out = capsys.readouterr().out
    assert f"bf16 capture: measured, {hybrid}" in out and f"fp8 capture: measured, {hybrid}" in out
    # bf16: 6 x 12,000 = 72,000 > 2 x 30,000, so 5 + 3 (60,000); FP8: 5 x 18,000 = 3 x 30,000 = 90,000
    assert "| **5 + 3** | 60,000 | 90,000 | target | **60,000** |" in out
    assert "| **5 + 3** | 90,000 | 90,000 | target | **90,000** |" in out
    assert "capture 1.500x per target GPU; best split 5 + 3 -> 5 + 3, projected 60,000 -> 90,000 tok/s" in out


def test_fp8_projection_without_a_measurement_says_it_is_an_estimate(tmp_path, capsys):
    assert projection.main(["--fp8"]) == 0
    out = capsys.readouterr().out
    assert "fp8 capture: FP8 ESTIMATE, not measured" in out and "efficiency 1.0 (assumed" in out
    assert f"capture **{projection.FP8_ESTIMATE:,.0f}** tok/s" in out
    seeds = tmp_path / "results.json"  # a seeds run's drafter rate and efficiency are taken over
    seeds.write_text(json.dumps({"projection8": projection.project(11_000.0, 40_000.0, 0.9)}))
    assert projection.main(["--fp8", "--capture-fp8", "20000", str(seeds)]) == 0
    out = capsys.readouterr().out
    assert "fp8 capture: given" in out and "drafter **40,000**" in out and "efficiency **0.900**" in out


def test_fp8_projection_takes_the_faster_of_the_two_scalings(tmp_path, capsys):
    steps = {
        "direct_packed": {"tok_s": 12_000.0},
        "fp8_packed": {"tok_s": 16_000.0},
        "fp8row_packed": {"tok_s": 18_000.0},
    }
    hybrid = tmp_path / "bench_hybrid.json"
    hybrid.write_text(json.dumps({"steps": steps}))
    assert projection.main(["--fp8", "--hybrid", str(hybrid), "--drafter", "30000"]) == 0
    assert "capture 1.500x per target GPU" in capsys.readouterr().out  # row's 18,000, not block's 16,000
