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


# -- several seeds in one run: --blocks 8:2:dflash@s2 -------------------------------------------------------
def test_a_seed_suffix_names_the_drafter_and_pairs_it_with_the_run_seeds_one():
    from bench.acceptance_specs import comparisons, key_of, tag_of

    s = parse_spec("8:2:dflash@s2")
    assert s.seed == 2 and tag_of(s) == "b8_dflash_s2" and key_of(s, "t") == "t_block8_dflash_s2"
    both = parse_spec("8:2:dflash@t3-7@s3")
    assert both.seed == 3 and both.target_layers == (3, 7) and parse_spec("8:2:dflash@s3@t3-7") == both
    assert parse_spec("8:2:dflash").seed is None
    group = [parse_spec("8:2:dflash"), s]
    assert ("t_block8_dflash", "t_block8_dflash_s2", "s2_over_run_seed") in comparisons(group, "t")
    assert not any("over_run_seed" in w for *_, w in comparisons([s], "t"))  # nothing to pair it with
    for bad in ("8:2:dflash@sx", "8:2:dflash@s2@s3", "8:2:dflash@s-1"):
        with pytest.raises(ValueError, match="8:2:dflash@s"):
            parse_spec(bad)


def test_each_drafter_trains_with_its_own_seed_and_records_it(tmp_path, monkeypatch):
    seeds = []
    monkeypatch.setattr(ba, "start_drafter", lambda cfg, work, out, x, seed, soft: seeds.append(seed))
    monkeypatch.setattr(ba, "finish_drafter", lambda st: {"accept_len_est": 3.0})
    monkeypatch.setattr(ba, "start_eval", lambda *args, **kwargs: None)
    monkeypatch.setattr(ba, "finish_eval", lambda st: {"mean_accept_len": 3.0})
    a, cfg = _settled("--seed", "1", "--drafter-seed", "4", "--speed-prompts", "0")
    a.out, a.fp8_served, a.frozen_steps = str(tmp_path), [], 0
    group, res = [parse_spec(x) for x in ("8:2:dflash", "8:2:dflash@s2", "8:2:dflash@s3")], {}
    ba.run_group(a, {**cfg, "target_tag": "t"}, str(tmp_path), group, [], res, lambda: None)
    assert seeds == [4, 2, 3]
    keys = ("t_block8_dflash", "t_block8_dflash_s2", "t_block8_dflash_s3")
    assert [res[k]["train"]["seed"] for k in keys] == [4, 2, 3]  # in the evaluated results too
    assert all(res[k]["eval"]["mean_accept_len"] == 3.0 for k in keys)


def test_results_record_the_prompts_the_evaluation_reads(tmp_path):
    """results.json keeps the held-out prompts, so a CPU tool on another Python (another stdlib: other prompts
    for the seed) pairs with the ones this run decoded."""
    import json

    a, cfg = _settled("--seed", "3")
    res: dict = {}
    ba.prepare_corpus(a, cfg, str(tmp_path), res)
    with open(tmp_path / "heldout" / "prompts.jsonl") as f:
        read = [json.loads(line)["input_ids"][: ba.PROMPT] for line in f][: cfg["prompts"]]
    assert len(res["heldout_prompts"]) == cfg["prompts"] and read
    assert ba.prompts_of(res, cfg["prompts"], "r") == read
    assert ba.prompts_of(res, 2, "r") == read[:2]
