"""bench/bench_hybrid.py --tiny (the CPU smoke run) with the issue-36 steps: the conv's reference timed against
its byte floor, the model quantised to FP8 in place after the bf16 step (block and rowwise scales), FP8 against
bf16 in the results for both, each FP8 packed row equal to its documents alone, the FP8 columns of the fp32
accuracy table (block, row, row converted from block)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_run_with_the_fp8_and_conv_steps(tmp_path):
    steps = (
        "conv,direct_packed,fp8_packed,fp8_packed_vs_alone,fp8row_packed,fp8row_packed_vs_alone,accuracy_fp32"
    )
    cmd = [sys.executable, "bench/bench_hybrid.py", "--tiny", "--out", str(tmp_path), "--steps", steps]
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "bench_hybrid.json").read_text())
    st = res["steps"]
    assert st["conv"]["reference_vs_floor"] > 0 and st["conv"]["kernel"].startswith("not run: CPU")
    q = res["fp8_quantise"]
    assert q["quantised_linears"] > 0 and q["row_linears"] == q["quantised_linears"]  # the CPU: every one
    n = len(res["capture_layers"])
    for tag in ("fp8", "fp8row"):
        errs = st[f"{tag}_packed"]["vs_bf16_by_layer"]
        assert len(errs) == n and all(0 < e < 0.1 for e in errs), tag  # quantised, and not broken
        v = res[f"{tag}_vs_bf16"]
        assert v["fp8_over_bf16"] == v["fp8_tok_s"] / v["bf16_tok_s"]
        assert st[f"{tag}_packed_vs_alone"]["max_rel_err"] < 1e-5  # the packed FP8 row = its documents alone
    assert st["fp8row_packed"]["vs_bf16_by_layer"] != st["fp8_packed"]["vs_bf16_by_layer"]  # another layout
    acc = st["accuracy_fp32"]
    for label in ("fp8", "fp8row", "fp8row_from_block"):
        for k in (
            f"{label}_fast_eager_single",
            f"{label}_fast_eager_packed",
            f"{label}_vs_bf16_fast_eager_packed",
        ):
            assert len(acc[k]) == 4 and all(0 < e < 0.1 for e in acc[k]), k
    assert "bf16 / FP8 block / FP8 row packed" in r.stdout and "FP8 row vs bf16 rel err" in r.stdout
