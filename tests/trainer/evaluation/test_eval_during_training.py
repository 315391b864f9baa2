"""--eval-every on the real trainer (tiny target, CPU): eval records reach metrics.jsonl, and a run stopped
and resumed with evaluations on still equals an uninterrupted run without them, bit for bit. The trainer runs in
this process (the stop-and-resume flow itself runs in real processes in
tests/trainer/test_pipeline_stop_resume.py); the evaluations it starts are real processes (``python -m
trainer.evaluate``), hence e2e."""

from __future__ import annotations

import pytest

from tests.support.trainer_run import events, records, run_in_process, steps, tiny_flags

pytestmark = pytest.mark.e2e

N = 8
EXTRA = ("--max-steps", str(N), "--seed", "5", "--save-every", "2")


def test_eval_records_and_exact_resume(tiny_assets, tmp_path, capfd):
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    evals = ("--eval-every", "1", "--eval-data", str(tiny_assets / "data"), "--eval-prompts", "2",
             "--eval-new-tokens", "8")  # fmt: skip
    assert run_in_process(tiny_flags(tiny_assets, ref_dir, *EXTRA)) == 0, capfd.readouterr()
    rc = run_in_process(tiny_flags(tiny_assets, cut_dir, *EXTRA, *evals), stop_after_step=3)
    assert rc == 0, capfd.readouterr()
    k = [e for e in events(cut_dir) if e["name"] == "checkpoint_saved"][-1]["step"]
    rc = run_in_process(tiny_flags(tiny_assets, cut_dir, *EXTRA, *evals, "--resume", "auto"))
    assert rc == 0, capfd.readouterr()

    ref_steps = {s["step"]: s for s in steps(ref_dir)}
    resumed = [s for s in steps(cut_dir) if s["step"] > k][-(N - k) :]
    assert [s["step"] for s in resumed] == list(range(k + 1, N + 1))
    for s in resumed:
        r = ref_steps[s["step"]]
        keys = ("loss", "grad_norm", "acc", "accept_len_est")
        assert [s[x] for x in keys] == [r[x] for x in keys], s["step"]

    recs = records(cut_dir)
    ev = [r for r in recs if r["kind"] == "eval"]
    # the resumed run evaluates every save (--eval-every 1), the final checkpoint included, before `stopped`
    assert N in [e["step"] for e in ev], ev
    last_run = recs[max(i for i, r in enumerate(recs) if r.get("name") == "started") :]
    assert last_run[-1]["name"] == "stopped" and any(r["kind"] == "eval" for r in last_run)
    for e in ev:
        assert e["checkpoint"].endswith(f"step_{e['step']:08d}")
        assert 1.0 <= e["accept_len"] <= 8 and len(e["per_position"]) == 7
        assert (e["prompts"], e["new_tokens"], e["temperature"]) == (2, 8, 0.0) and e["seconds"] > 0
        assert e["accept_len_se"] is None or e["accept_len_se"] >= 0
    # the console's health checks read these very records: the real acceptance they track is the record's
    from console.core.events import Record
    from console.core.health import Health

    h = Health()
    for r in recs:
        h.apply(Record(r))
    assert h.f.accept_last == ev[-1]["accept_len"] and h.f.accept_best == max(e["accept_len"] for e in ev)
    assert (cut_dir / "evals" / f"step_{N:08d}" / "drafter" / "model.safetensors").exists()

    # the checkpoint: drafter/ in the training dtype (exact resume), export/ in bf16 for serving, both 0644
    import os
    import stat

    from safetensors import safe_open

    ckpt = cut_dir / "checkpoints" / f"step_{N:08d}"
    for sub, dtype in (("drafter", "torch.float32"), ("export", "torch.bfloat16")):
        with safe_open(str(ckpt / sub / "model.safetensors"), "pt") as f:
            assert str(f.get_tensor("fc.weight").dtype) == dtype
        for fn in ("config.json", "model.safetensors"):
            assert stat.S_IMODE(os.stat(ckpt / sub / fn).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(cut_dir / "run.json").st_mode) == 0o644
