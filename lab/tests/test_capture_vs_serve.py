"""lab/capture_vs_serve.py on the CPU: the trainer's packed capture, the evaluation engine's prefill and
transformers' fp32 forward give a tiny hybrid target's features alike, the last decoder layer too, not the final
norm's output."""

from __future__ import annotations

import json

from tests.support.trainer_run import run_script as _run


def test_capture_and_serving_features_agree_on_a_hybrid_target(tiny_hybrid, tmp_path):
    out = tmp_path / "cvs.json"
    target, data = str(tiny_hybrid / "target"), str(tiny_hybrid / "data")
    _run("lab/capture_vs_serve.py", target, "--prompts", data, "--layers", "1,3,7", "--docs", "10", "--len",
         "48", "--out", str(out))  # fmt: skip
    res = json.loads(out.read_text())
    assert res["docs"] == 10 and res["layers"] == [1, 3, 7]
    for key in ("train_vs_ref", "serve_vs_ref", "train_vs_serve"):
        assert len(res[key]) == 3 and all(0 <= e < 1e-5 for e in res[key]), (key, res[key])
