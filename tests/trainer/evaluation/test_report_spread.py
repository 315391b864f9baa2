"""The spread of an evaluation's mean acceptance length over prompts (``report.over_prompts``): a prompt's
verify steps are not independent, so the prompt is the unit that varies (docs/evaluate.md: a 16-prompt CPU
evaluation read 3.62 where 464 prompts read 4.76)."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.evaluation.report import format_report, over_prompts, summarize


def _prompts(seed: int, n: int = 32) -> list[list[int]]:
    """Prompts of two kinds, as a weak target's text has them: some loop (whole blocks of 8 accepted), the
    rest are hard (1-3 per step); each prompt 10-40 verify steps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(10, 41))
        if rng.random() < 0.3:
            out.append([8] * k)
        else:
            out.append(rng.integers(1, 4, size=k).tolist())
    return out


def test_identical_prompt_means_have_no_spread_and_one_prompt_has_none():
    r = over_prompts([[2, 4], [3, 3, 3], [1, 5, 3, 3]])
    assert r["mean_accept_len_se"] == pytest.approx(0.0, abs=1e-12)
    assert r["prompt_accept_len"] == [3.0, 3.0, 3.0] and r["prompt_steps"] == [2, 3, 4]
    assert over_prompts([[1, 2, 8]])["mean_accept_len_se"] is None
    # a prompt that took no step (empty output) does not count as a prompt of the spread
    assert over_prompts([[5, 5], []])["mean_accept_len_se"] is None


def test_the_pooled_mean_is_rebuilt_from_the_per_prompt_figures():
    pp = _prompts(1)
    r, s = over_prompts(pp), summarize([x for p in pp for x in p], 8)
    pooled = sum(m * n for m, n in zip(r["prompt_accept_len"], r["prompt_steps"], strict=True)) / sum(
        r["prompt_steps"]
    )
    assert pooled == pytest.approx(s["mean_accept_len"], rel=1e-12)
    assert sum(r["prompt_steps"]) == s["verify_steps"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_standard_error_matches_a_bootstrap_over_prompts_and_not_over_steps(seed):
    pp = _prompts(seed)
    se = over_prompts(pp)["mean_accept_len_se"]
    rng = np.random.default_rng(100 + seed)
    tokens = np.array([sum(p) for p in pp], dtype=float)
    steps = np.array([len(p) for p in pp], dtype=float)
    idx = rng.integers(0, len(pp), size=(20000, len(pp)))
    boot = (tokens[idx].sum(1) / steps[idx].sum(1)).std()
    assert se == pytest.approx(boot, rel=0.06)
    # treating the verify steps as independent understates it several times over
    flat = np.array([x for p in pp for x in p], dtype=float)
    assert flat.std(ddof=1) / np.sqrt(len(flat)) < se / 2


def test_text_report_shows_the_standard_error():
    pp = _prompts(4)
    r = {**summarize([x for p in pp for x in p], 8), **over_prompts(pp)}
    r.update(drafter="d", block_size=8, target="t", prompts=len(pp), max_new_tokens=128, temperature=0.0,
             device="cpu", new_tokens=1000, spec_tok_s=1.0, target_tok_s=1.0, speedup=1.0, seconds=1.0)  # fmt: skip
    text = format_report(r)
    assert f"{r['mean_accept_len']:.3f} +- {r['mean_accept_len_se']:.3f}" in text
    assert "standard error over prompts" in text


def _report(pp: list[list[int]]) -> dict:
    return {**summarize([x for p in pp for x in p], 8), **over_prompts(pp), "prompts": len(pp)}


def test_paired_ratio_of_two_drafters_on_the_same_prompts():
    from trainer.evaluation.report import paired_ratio

    a = _prompts(5)
    same = paired_ratio(_report(a), _report(a), resamples=2000)
    assert same["ratio"] == pytest.approx(1.0) and same["ci95"] == [pytest.approx(1.0), pytest.approx(1.0)]
    # B accepts one more token on every step of every prompt: ahead, and the paired interval excludes 1
    b = [[x + 1 for x in p] for p in a]
    r = paired_ratio(_report(a), _report(b), resamples=2000)
    ra, rb = _report(a)["mean_accept_len"], _report(b)["mean_accept_len"]
    assert r["ratio"] == pytest.approx(rb / ra) and 1.0 < r["ci95"][0] <= r["ratio"] <= r["ci95"][1]
    # the same gain judged unpaired (B's prompts shuffled against A's) is far less certain
    rng = np.random.default_rng(0)
    shuffled = [b[i] for i in rng.permutation(len(b))]
    u = paired_ratio(_report(a), _report(shuffled), resamples=2000)
    assert u["ci95"][1] - u["ci95"][0] > 2 * (r["ci95"][1] - r["ci95"][0])
    with pytest.raises(ValueError, match="same prompts"):
        paired_ratio(_report(a), _report(a[:-1]))


def _full(pp: list[list[int]], tokens: int, tok_s: float) -> dict:
    return {**_report(pp), "block_size": 8, "drafter": "d", "target": "t", "temperature": 0.0, "max_new_tokens": 64,
            "new_tokens": tokens, "spec_tok_s": tok_s, "target_tok_s": tok_s / 2, "rewind_forwards": 0,
            "greedy_mismatches": 0, "greedy_match": True, "seconds": tokens / tok_s}  # fmt: skip


def test_pooled_shards_equal_one_evaluation_of_all_their_prompts():
    """Shards run side by side (``report.pool``): the statistics one evaluation of all the prompts would report,
    the speed as all tokens over all decode seconds."""
    from trainer.evaluation.report import pool

    pp = _prompts(6)
    whole = _full(pp, 900, 100.0)
    parts = [_full(pp[:2], 300, 100.0), _full(pp[2:3], 100, 50.0), _full(pp[3:], 500, 250.0)]
    got = pool(parts)
    for key in ("mean_accept_len", "per_position", "histogram", "verify_steps", "prompt_steps", "prompts"):
        assert got[key] == whole[key], key
    for key in ("mean_accept_len_se", "prompt_accept_len"):
        assert got[key] == pytest.approx(whole[key]), key
    assert got["new_tokens"] == 900 and got["shards"] == 3 and got["greedy_match"] is True
    assert got["spec_tok_s"] == pytest.approx(900 / (3 + 2 + 2)) and got["speedup"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="drafter"):
        pool([parts[0], {**parts[1], "drafter": "other"}])
