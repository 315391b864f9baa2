"""bench/acceptance_specs.py: --blocks drafter specs with a draft-layer pattern, their trainer flags and keys."""

from __future__ import annotations

import pytest

from bench.acceptance_specs import Spec, comparisons, drafter_flags, key_of, parse_spec, parse_specs, tag_of
from trainer.run.flags import build_parser


def test_the_qwen36_pattern_becomes_the_trainers_layer_types_and_window():
    s = parse_spec("16:5:dflash:SSSSF")
    assert s == Spec(16, 5, "dflash", None, "SSSSF", 2048)
    flags = drafter_flags(s)
    args = build_parser().parse_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *flags])
    assert args.layer_types == ["sliding_attention"] * 4 + ["full_attention"]
    assert args.sliding_window == 2048 and args.arch == "dflash"
    assert (
        tag_of(s) == "b16_dflash_SSSSF" and key_of(s, "qwen3_5_h384") == "qwen3_5_h384_block16_dflash_SSSSF"
    )


def test_a_window_other_than_the_recipes_is_named_and_plain_specs_keep_their_names():
    s = parse_spec("16:5:dflash:sssSF:256")
    assert s.pattern == "SSSSF" and s.window == 256 and tag_of(s) == "b16_dflash_SSSSFw256"
    assert drafter_flags(s)[-2:] == ["--sliding-window", "256"]
    plain = parse_spec("8:2")
    assert plain == Spec(8, 2) and drafter_flags(plain) == [] and tag_of(plain) == "b8"
    assert key_of(plain, "qwen3_d512") == "qwen3_d512_block8"
    assert drafter_flags(parse_spec("8:2:dflash2ug")) == ["--arch", "dflash2", "--selector-unary-grad"]
    assert parse_spec("16:3::FFF").window is None  # all full: no window


@pytest.mark.parametrize(
    "bad, says",
    [("16:5:dflash:SSSF", "5 letters"), ("16:5:dflash:SSSXF", "S and F"), ("16:5:dflash:FFFFF:256", "needs a"),
     ("x:2", "block"), ("1:2", ">= 2"), ("8", "expected"), ("16:5:dflash:SSSSF:0", "window")],
)  # fmt: skip
def test_bad_specs_are_refused_with_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match=says):
        parse_spec(bad)


def test_comparisons_pair_dflash2_with_dflash1_and_a_pattern_with_full_layers():
    group = parse_specs("8:2:dflash,8:2:dflash2,16:5:dflash,16:5:dflash:SSSSF,16:5:dflash2:SSSSF", "data")
    pairs = {(a, b): what for a, b, what in comparisons(group, "t")}
    assert pairs[("t_block8_dflash", "t_block8_dflash2")] == "dflash2_over_dflash"
    assert pairs[("t_block16_dflash_SSSSF", "t_block16_dflash2_SSSSF")] == "dflash2_over_dflash"
    assert pairs[("t_block16_dflash", "t_block16_dflash_SSSSF")] == "SSSSF_over_5_full"
    assert ("t_block16_dflash2", "t_block16_dflash2_SSSSF") not in pairs  # no such drafter trained
    compare = parse_specs("16:5:dflash:SSSSF", "compare")
    assert [s.text for s in compare] == ["original", "regenerated"]
    assert comparisons(compare, "t") == [
        ("t_block16_dflash_SSSSF_original", "t_block16_dflash_SSSSF_regenerated", "regenerated_over_original")
    ]


def test_target_layers_become_the_trainers_flag_a_name_and_a_comparison_with_the_default_layers():
    s = parse_spec("8:2:dflash@fp8@t3-7")
    assert (s.capture, s.target_layers) == ("fp8", (3, 7))
    assert tag_of(s) == "b8_dflash_fp8cap_t3-7" and key_of(s, "h") == "h_block8_dflash_fp8cap_t3-7"
    flags = drafter_flags(s)
    args = build_parser().parse_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *flags])
    assert args.target_layer_ids == [3, 7]
    group = parse_specs("8:2:dflash,8:2:dflash@t3-7,8:2:dflash2@t2-6", "data")
    pairs = {(a, b): what for a, b, what in comparisons(group, "t")}
    assert pairs[("t_block8_dflash", "t_block8_dflash_t3-7")] == "t3-7_over_default_layers"
    assert not any(b == "t_block8_dflash2_t2-6" and "layers" in w for (_a, b), w in pairs.items())  # no twin
    twin = parse_specs("8:2:dflash@fp8@t3-7", "data")  # the FP8 one's bf16 twin keeps its layers
    assert [(x.capture, x.target_layers) for x in twin] == [(None, (3, 7)), ("fp8", (3, 7))]


@pytest.mark.parametrize(
    "bad, says",
    [("8:2:dflash@t3-3", "distinct"), ("8:2:dflash@tx", "target layer"), ("8:2:dflash@fp4", "not one of"),
     ("8:2:dflash@fp8@fp8", "twice"), ("8:2:dflash@t-1", "target layer")],
)  # fmt: skip
def test_bad_modifiers_are_refused(bad, says):
    with pytest.raises(ValueError, match=says):
        parse_spec(bad)


# -- bench/acceptance_pair.py: one run's drafter against another run's, prompt by prompt -------------------
def _run(accepts: list[float], steps: list[int], **over) -> dict:
    ev = {"mean_accept_len": sum(a * s for a, s in zip(accepts, steps, strict=True)) / sum(steps), "prompts": len(steps),
          "prompt_accept_len": accepts, "prompt_steps": steps}  # fmt: skip
    run = {
        "corpus": {"sha256": "c"},
        "seed": 1,
        "config": {"size": "full", "prompts": len(steps), "new": 128},
    }
    run.update(over)
    return {**run, "k": {"eval": ev}}


def test_pairing_two_runs_gives_the_ratio_and_refuses_other_prompts():
    from bench.acceptance_pair import pair

    dense, hybrid = _run([4.0, 2.0, 3.0], [32, 64, 40]), _run([3.6, 1.8, 2.7], [32, 64, 40])
    out = pair(dense, "k", hybrid, "k")
    assert out["paired"]["ratio"] == pytest.approx(0.9, rel=1e-9)  # every prompt accepted 0.9 x as much
    assert out["paired"]["ci95"][0] == pytest.approx(0.9, rel=1e-9) == out["paired"]["ci95"][1]
    with pytest.raises(SystemExit, match="seed"):
        pair(dense, "k", _run([1.0, 1.0, 1.0], [1, 1, 1], seed=2), "k")
    with pytest.raises(SystemExit, match="no evaluation"):
        pair(dense, "k", hybrid, "missing")


def _scaled(scale: float, seed: int = 1) -> dict:
    return _run([scale * x for x in (4.0, 2.0, 3.0, 2.5)], [32, 64, 40, 50], seed=seed)


def test_several_runs_a_side_widen_the_interval_by_their_spread():
    from bench.acceptance_pair import pair, runs

    # every prompt scales alike, so prompts alone leave no spread: a single pair's interval is one point
    one = pair(_scaled(1.0), "k", _scaled(1.2), "k")["paired"]
    assert one["ci95"][0] == pytest.approx(1.2) == one["ci95"][1]
    out = runs([("a1", _scaled(1.0), "k"), ("a2", _scaled(1.2), "k")], [("b1", _scaled(1.0), "k")])
    assert out["real_a"] == pytest.approx([1.0 * out["real_b"][0], 1.2 * out["real_b"][0]])
    r = out["runs"]
    assert r["ratio"] == pytest.approx(1 / 1.1) and r["runs"] == [2, 1]
    # drawing the runs of side A: both the 1.0 run (ratio 1.0), both the 1.2 run (1 / 1.2), or one of each
    assert r["ci95"] == pytest.approx([1 / 1.2, 1.0])


def test_runs_refuse_other_prompts_and_the_cli_wants_both_sides(tmp_path, capsys):
    import json

    from bench.acceptance_pair import main, runs

    with pytest.raises(SystemExit, match="b2 did not decode the prompts of a1.*seed"):
        runs([("a1", _scaled(1.0), "k")], [("b1", _scaled(1.0), "k"), ("b2", _scaled(1.0, seed=2), "k")])
    paths = []
    for i, scale in enumerate((1.0, 0.9, 0.8)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_scaled(scale)))
    main(["--a", str(paths[0]), "k", "--b", str(paths[1]), "k", "--b", str(paths[2]), "k"])
    assert json.loads(capsys.readouterr().out)["runs"]["ratio"] == pytest.approx(0.85)
    for argv in (
        ["--a", str(paths[0]), "k"],
        [str(paths[0]), "k", str(paths[1]), "k", "--b", str(paths[2]), "k"],
    ):
        with pytest.raises(SystemExit):
            main(argv)


def test_first_pairs_a_longer_run_on_its_first_prompts_only():
    from bench.acceptance_pair import pair, runs

    short = _run([4.0, 2.0], [32, 64])
    # the longer run's first two prompts read 0.9 x the short run's; its third would pull the ratio down
    longer = _run([3.6, 1.8, 0.1], [32, 64, 500])
    with pytest.raises(SystemExit, match="prompts"):
        pair(short, "k", longer, "k")  # without --first the counts differ
    out = pair(short, "k", longer, "k", first=2)
    assert out["paired"]["ratio"] == pytest.approx(0.9) and out["real_b"] == pytest.approx(
        0.9 * out["real_a"]
    )
    assert runs([("a", short, "k")], [("b", longer, "k")], first=2)["runs"]["ratio"] == pytest.approx(0.9)
    with pytest.raises(SystemExit, match="fewer than --first 3"):
        pair(short, "k", longer, "k", first=3)  # the short run has no third prompt
    with pytest.raises(SystemExit, match="seed"):
        pair(short, "k", _run([3.6, 1.8, 0.1], [32, 64, 500], seed=2), "k", first=2)
