"""bench/bench_hybrid.py --tiny (the CPU smoke run) with the issue-36 steps: the conv's reference timed against
its byte floor, the model quantised to FP8 in place after the bf16 step, FP8 against bf16 in the results, the
FP8 packed row equal to its documents alone, the FP8 columns of the fp32 accuracy table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_run_with_the_fp8_and_conv_steps(tmp_path):
    steps = "conv,direct_packed,fp8_packed,fp8_packed_vs_alone,accuracy_fp32"
    cmd = [sys.executable, "bench/bench_hybrid.py", "--tiny", "--out", str(tmp_path), "--steps", steps]
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "bench_hybrid.json").read_text())
    st = res["steps"]
    assert st["conv"]["reference_vs_floor"] > 0 and st["conv"]["kernel"].startswith("not run: CPU")
    assert res["fp8_quantise"]["quantised_linears"] > 0
    n = len(res["capture_layers"])
    assert len(st["fp8_packed"]["vs_bf16_by_layer"]) == n
    assert all(0 < e < 0.1 for e in st["fp8_packed"]["vs_bf16_by_layer"])  # quantised, and not broken
    v = res["fp8_vs_bf16"]
    assert v["fp8_over_bf16"] == v["fp8_tok_s"] / v["bf16_tok_s"]
    assert st["fp8_packed_vs_alone"]["max_rel_err"] < 1e-5  # the packed FP8 row = its documents alone
    acc = st["accuracy_fp32"]
    for k in ("fp8_fast_eager_single", "fp8_fast_eager_packed", "fp8_vs_bf16_fast_eager_packed"):
        assert len(acc[k]) == 4 and all(0 < e < 0.1 for e in acc[k]), k
    assert "FP8 / bf16 packed" in r.stdout
