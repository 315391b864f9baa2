"""bench_acceptance.py --drafter-seed: the drafters train with it (and the frozen passes from them), while the
corpus's chunks, the prompts and the target stay --seed's, so two runs pair prompt by prompt (the spread of
training itself, which the paired intervals over prompts do not cover)."""

from __future__ import annotations

import pytest

import bench.bench_acceptance as ba
from bench.acceptance_flags import build_parser
from bench.acceptance_specs import parse_spec


def _settled(*flags):
    ap = build_parser()
    a = ap.parse_args(["--tiny", "--out", "o", *flags])
    return a, ba.settle(ap, a)[0]


def test_the_drafter_seed_defaults_to_the_seed_and_is_recorded():
    a, cfg = _settled("--seed", "1")
    assert ba.drafter_seed(a) == 1 and cfg["drafter_seed"] == 1
    a, cfg = _settled("--seed", "1", "--drafter-seed", "2")
    assert ba.drafter_seed(a) == 2 and cfg["drafter_seed"] == 2 and a.seed == 1


def test_the_drafters_train_with_it_and_the_prompts_stay_the_seeds(tmp_path, monkeypatch):
    seeds = []
    monkeypatch.setattr(ba, "start_drafter", lambda cfg, work, out, x, seed, soft: seeds.append(seed))
    monkeypatch.setattr(ba, "finish_drafter", lambda st: {})

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ba, "start_eval", stop)
    prompts = []
    for flags in ((), ("--drafter-seed", "5")):
        a, cfg = _settled("--seed", "1", *flags)
        a.out, a.fp8_served = str(tmp_path), []
        with pytest.raises(KeyboardInterrupt):
            ba.run_group(
                a, {**cfg, "target_tag": "t"}, str(tmp_path), [parse_spec("8:2:dflash")], [], {}, list
            )
        work = tmp_path / f"w{len(prompts)}"
        ba.prepare_corpus(a, cfg, str(work), {})
        prompts.append((work / "heldout" / "prompts.jsonl").read_text())
    assert seeds == [1, 5]
    assert prompts[0] == prompts[1] and prompts[0]
