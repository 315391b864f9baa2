"""lab/copy_share.py: prompt lookup marks exactly the tokens a repeated text predicts, the summary's ratio
compares the two drafters at equal copyable share, and bad arguments are refused."""

from __future__ import annotations

import json

import pytest

from lab import copy_share


def test_prompt_lookup_predicts_a_repeat_and_not_new_text():
    prompt = [1, 2, 3, 4, 5, 6]
    assert copy_share.copyable(prompt, [1, 2, 3, 4]) == [False, False, False, True]  # 1 2 3 seen: then 4
    assert copy_share.copyable([7, 1, 2, 3, 8, 1, 2, 3], [9]) == [False]  # the most recent "1 2 3" says 8
    assert copy_share.copyable([7, 1, 2, 3, 8, 1, 2, 3], [8]) == [True]
    assert not any(copy_share.copyable(prompt, [10, 11, 12]))
    assert copy_share.copyable([5, 5, 5, 5], [5, 5]) == [True, True]  # a run of one byte


def test_the_summary_compares_at_equal_share():
    shares = {"a": [0.2, 0.4, 0.6, 0.8], "b": [0.1, 0.3, 0.5, 0.7]}
    accept = {"a": [2 + 2 * s for s in shares["a"]], "b": [0.9 * (2 + 2 * s) for s in shares["b"]]}
    out = copy_share.summary(shares, accept)
    assert out["targets"]["a"]["fit"] == pytest.approx([2.0, 2.0])
    assert out["targets"]["a"]["correlation"] == pytest.approx(1.0)
    # b's drafter is 0.9 x a's at any share, though b's text is less copyable and its plain mean lower still
    assert all(r == pytest.approx(0.9) for r in out["ratio_at_mean_share"].values())
    assert out["targets"]["b"]["mean_acceptance"] / out["targets"]["a"]["mean_acceptance"] < 0.9
    assert sum(n for n, _ in out["targets"]["a"]["quartiles"]) == 4


def _here() -> dict:
    from bench.bench_acceptance import local_corpus_id

    return local_corpus_id()


def _results(path, prompts=None, corpus=None) -> str:
    run = {"corpus": corpus or _here(), "seed": 1, "k": {"eval": {"prompt_accept_len": [1.0, 2.0]}}}
    if prompts is not None:
        run["heldout_prompts"] = [bytes(p).hex() for p in prompts]
    path.write_text(json.dumps(run))
    return f"{path}:k"


def test_a_run_of_another_corpus_pairs_only_by_the_prompts_it_recorded(tmp_path):
    """This machine's stdlib draws other prompts for a seed than another Python's: a run made there is paired by
    the prompts its results.json records, and refused if it records none."""
    from bench.bench_acceptance import heldout_prompts

    there = {**_here(), "sha256": "0" * 64, "python": "3.12.3", "files": 574}
    old = _results(tmp_path / "old.json", corpus=there)
    with pytest.raises(SystemExit, match=r"another corpus \(Python 3\.12\.3's standard library, 574 files\)"):
        copy_share.run_prompts(old, 2)
    theirs = [[104, 105], [120, 121, 122]]
    new = _results(tmp_path / "new.json", prompts=theirs, corpus=there)
    assert copy_share.run_prompts(new, 2) == theirs
    assert copy_share.prompt_acceptance(new, theirs) == [1.0, 2.0]
    with pytest.raises(SystemExit, match="other prompts"):  # a run here decoded this machine's draw instead
        copy_share.prompt_acceptance(_results(tmp_path / "here.json"), theirs)
    assert copy_share.run_prompts(_results(tmp_path / "here.json"), 2) == heldout_prompts(2, 1)
    (tmp_path / "bad.json").write_text(json.dumps({"heldout_prompts": ["zz"], "k": {}}))
    with pytest.raises(SystemExit, match="not hex"):
        copy_share.run_prompts(f"{tmp_path / 'bad.json'}:k", 1)


def test_results_without_per_prompt_acceptance_and_bad_arguments_are_refused(tmp_path):
    prompts = [[1, 2], [3]]
    spec = _results(tmp_path / "results.json", prompts=prompts)
    assert copy_share.prompt_acceptance(spec, prompts) == [1.0, 2.0]
    with pytest.raises(SystemExit, match="no per-prompt acceptance"):
        copy_share.prompt_acceptance(spec.replace(":k", ":missing"), prompts)
    with pytest.raises(SystemExit, match="not a list of at least 3"):  # it recorded two prompts
        copy_share.prompt_acceptance(spec, [*prompts, [4]])
    path = tmp_path / "results.json"
    with pytest.raises(SystemExit):
        copy_share.main(["--target", "a=d1", "--target", "b=d2", "--results", f"a={path}:k"])
