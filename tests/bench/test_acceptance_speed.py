"""bench_acceptance's ``--speed-prompts``: each drafter once more alone, unsharded, on the first N held-out
prompts, after the group's sharded evaluations; what it records and what it must not overwrite."""

from __future__ import annotations

import json

import pytest

from bench import bench_acceptance as ba
from bench.acceptance_flags import build_parser
from bench.acceptance_specs import parse_spec


class _Done:
    """A finished ``trainer.evaluate --json`` process (its report on stdout)."""

    def __init__(self, argv, stderr):
        stderr.write("evaluate: progress\n")  # as it runs: into its shard's log file
        stderr.flush()
        self.argv, self.returncode = argv, 0
        n = int(argv[argv.index("--num-prompts") + 1])
        self.report = {"target_tok_s": 400.0, "spec_tok_s": 900.0, "speedup": 2.25, "mean_accept_len": 3.5,
                       "prompts": n, "new_tokens": 16 * n, "histogram": [1], "verify_steps": 1}  # fmt: skip

    def communicate(self):
        return json.dumps(self.report) + "\n", None


def test_each_drafter_alone_in_one_process_on_the_first_prompts(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(
        ba.subprocess, "Popen", lambda argv, **kw: launched.append(_Done(argv, kw["stderr"])) or launched[-1]
    )
    work, cfg = (
        str(tmp_path),
        {**ba.TINY, "eval_shards": 4, "prompts": 4, "speed_prompts": 2, "target_tag": "t"},
    )
    group = [parse_spec("8:2:dflash"), parse_spec("8:2:dflash2")]
    res = {"t_block8_dflash": {}, "t_block8_dflash2": {}}
    ba.speed_alone(cfg, work, work, group, res, lambda: None)
    assert len(launched) == 2  # one process a drafter, one after the other
    for p, tag in zip(launched, ("b8_dflash", "b8_dflash2"), strict=True):
        argv = p.argv
        assert argv[argv.index("--drafter") + 1] == f"{work}/run_{tag}"
        assert argv[argv.index("--prompts") + 1] == f"{work}/heldout"  # the whole set, not a shard
        assert argv[argv.index("--num-prompts") + 1] == "2"
        assert "--save-outputs" not in argv  # the main evaluation's decoded text stays as it was
    assert (tmp_path / "eval_b8_dflash_alone.log").read_text() == "evaluate: progress\n"
    assert not list(tmp_path.glob("*.shard*.log"))  # joined into the evaluation's log once it ended
    alone = res["t_block8_dflash2"]["speed_alone"]
    assert alone == {"target_tok_s": 400.0, "spec_tok_s": 900.0, "speedup": 2.25, "mean_accept_len": 3.5,
                     "prompts": 2, "new_tokens": 32}  # fmt: skip


def test_none_on_the_cpu_by_default_and_bad_counts_refused():
    ap = build_parser()
    cfg, _sets, _specs = ba.settle(ap, ap.parse_args(["--tiny", "--out", "o"]))
    assert cfg["speed_prompts"] == 0
    cfg, _sets, _specs = ba.settle(ap, ap.parse_args(["--tiny", "--out", "o", "--speed-prompts", "3"]))
    assert cfg["speed_prompts"] == 3
    res: dict = {}
    ba.speed_alone({**cfg, "speed_prompts": 0}, "w", "o", [parse_spec("8:2")], res, lambda: None)
    assert res == {}  # nothing launched, nothing recorded
    with pytest.raises(SystemExit):
        ba.settle(ap, ap.parse_args(["--tiny", "--out", "o", "--speed-prompts", "99"]))


class _Shard(_Done):
    """A finished shard with what ``report.pool`` reads."""

    def __init__(self, argv, stderr):
        super().__init__(argv, stderr)
        n = self.report["prompts"]
        self.report.update(block_size=8, prompt_accept_len=[3.5] * n, prompt_steps=[1] * n, seconds=1.0)


def test_a_shards_progress_is_on_disk_while_it_runs(tmp_path, monkeypatch):
    """A run cut by a time limit (the device call's) still shows how far each evaluation shard got."""
    launched = []
    monkeypatch.setattr(
        ba.subprocess, "Popen", lambda argv, **kw: launched.append(_Shard(argv, kw["stderr"])) or launched[-1]
    )
    cfg = {**ba.TINY, "eval_shards": 2, "prompts": 4, "target_tag": "t"}
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "prompts.jsonl").write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(4)))
    started = ba.start_eval(cfg, str(tmp_path), str(tmp_path), parse_spec("8:2:dflash"))
    shards = sorted(tmp_path.glob("eval_b8_dflash.shard*.log"))
    assert [p.read_text() for p in shards] == ["evaluate: progress\n"] * 2  # before anything waits for them
    ba.finish_eval(started)
    assert not list(tmp_path.glob("*.shard*.log"))
    assert (tmp_path / "eval_b8_dflash.log").read_text().count("evaluate: progress") == 2
    assert not any(
        "--no-baseline" in s.argv for s in launched
    )  # the target-only pass: speed and greedy check
    launched.clear()
    ba.finish_eval(
        ba.start_eval(
            {**cfg, "acceptance_only": True}, str(tmp_path), str(tmp_path), parse_spec("8:2:dflash")
        )
    )
    assert len(launched) == 2 and all("--no-baseline" in s.argv for s in launched)


def test_the_training_figures_are_saved_before_the_evaluations_start(tmp_path, monkeypatch):
    """A device call cut in the evaluations (2026-12-04: 575 s, both drafters trained) keeps what training
    measured in results.json."""
    saved = []
    monkeypatch.setattr(ba, "start_drafter", lambda cfg, work, out, x, seed, soft: x)
    monkeypatch.setattr(ba, "finish_drafter", lambda x: {"accept_len_est": 3.5, "block": x.block})

    def cut(*args, **kwargs):
        raise KeyboardInterrupt  # the time limit, as the evaluations start

    monkeypatch.setattr(ba, "start_eval", cut)
    a = build_parser().parse_args(["--tiny", "--out", str(tmp_path)])
    a.fp8_served, res = [], {}
    cfg = {**ba.TINY, "target_tag": "t"}
    group = [parse_spec("8:2:dflash"), parse_spec("16:3:dflash2")]
    with pytest.raises(KeyboardInterrupt):
        ba.run_group(a, cfg, str(tmp_path), group, [], res, lambda: saved.append(json.dumps(res)))
    seed = ba.drafter_seed(a)  # each drafter's seed beside what it measured
    assert json.loads(saved[-1]) == {
        "t_block8_dflash": {"train": {"accept_len_est": 3.5, "block": 8, "seed": seed}},
        "t_block16_dflash2": {"train": {"accept_len_est": 3.5, "block": 16, "seed": seed}},
    }
