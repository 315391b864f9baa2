"""bench_acceptance's FP8 comparison (issue 36): ``@fp8`` specs and their twins, the flags they give the trainer
and trainer.evaluate, the FP8 target it writes, the device refusal, and the paired result keys."""

from __future__ import annotations

import json

import pytest
import torch

from bench import acceptance_fp8
from bench.acceptance_specs import (
    Spec,
    capture_pairs,
    comparisons,
    key_of,
    parse_spec,
    parse_specs,
    served_fp8,
    tag_of,
)
from trainer.run.flags import build_parser


def test_an_fp8_spec_is_named_by_its_dtype_and_brings_its_bf16_twin_once():
    s = parse_spec("8:2:dflash@fp8")
    assert s == Spec(8, 2, "dflash", capture="fp8") and tag_of(s) == "b8_dflash_fp8cap"
    assert key_of(s, "qwen3_5_h384") == "qwen3_5_h384_block8_dflash_fp8cap"
    assert parse_spec("8:2:dflash@bf16") == parse_spec("8:2:dflash")  # bf16: the default, one key
    assert (
        parse_spec("16:5:@fp8:SSSSF").arch is None
        and tag_of(parse_spec("16:5:@fp8:SSSSF")) == "b16_SSSSF_fp8cap"
    )
    alone = parse_specs("8:2:dflash@fp8", "data")
    assert alone == [Spec(8, 2, "dflash"), Spec(8, 2, "dflash", capture="fp8")]  # the twin, trained too
    issue35 = "8:2:dflash,8:2:dflash2,16:3:dflash,16:3:dflash2,16:5:dflash:SSSSF"
    both = parse_specs(f"{issue35},8:2:dflash@fp8", "data")
    assert len(both) == 6 and both.count(Spec(8, 2, "dflash")) == 1  # the bf16 8:2:dflash is shared
    fp8 = served_fp8(both, every=False)
    assert fp8 == [Spec(8, 2, "dflash"), Spec(8, 2, "dflash", capture="fp8")]  # 3 evaluations more, not 6
    assert served_fp8(parse_specs(issue35, "data"), every=False) == []
    assert len(served_fp8(both, every=True)) == 6
    assert capture_pairs(both, "t") == [("t_block8_dflash", "t_block8_dflash_fp8cap")]
    # the other comparisons stay among drafters of one capture dtype
    assert all("fp8cap" not in a and "fp8cap" not in b for a, b, _ in comparisons(both, "t"))


def test_a_bad_capture_dtype_is_refused():
    with pytest.raises(ValueError, match="capture dtype 'fp16'"):
        parse_spec("8:2:dflash@fp16")


def test_the_fp8_spec_trains_and_serves_from_the_fp8_target_with_the_trainers_flag(tmp_path):
    work = str(tmp_path)
    assert acceptance_fp8.target_dir(work, None) == f"{work}/target"
    assert acceptance_fp8.target_dir(work, "fp8") == f"{work}/target_fp8"
    assert acceptance_fp8.dtype_flags(None) == []  # the bf16 runs' command lines are as before
    flags = acceptance_fp8.dtype_flags("fp8")
    args = build_parser().parse_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *flags])
    assert args.target_dtype == "fp8"
    from trainer.evaluation.run import build_parser as eval_parser

    ev = eval_parser().parse_args(["--target-model", "t", "--drafter", "d", "--prompts", "p", *flags])
    assert ev.target_dtype == "fp8"


def test_a_gpu_without_fp8_is_refused_before_anything_trains(monkeypatch):
    from trainer.target import fp8

    monkeypatch.setattr(fp8, "fp8_unsupported", lambda dev: "cuda:0 (A100) is sm_80")
    with pytest.raises(SystemExit, match=r"@fp8: .* sm_80"):
        acceptance_fp8.check_device("cuda:0")
    assert "dequantised" in acceptance_fp8.check_device("cpu")


def test_the_fp8_target_is_the_block128_checkpoint_the_trainer_reads(tiny_assets, tmp_path):
    from safetensors.torch import load_file

    from tests.trainer.target.fp8_ref import ref_dequantise, ref_quantise
    from trainer.run.fp8_config import read_dir
    from trainer.target import fp8

    src, dst = str(tiny_assets / "target"), str(tmp_path / "target_fp8")
    facts = acceptance_fp8.write_fp8_target(src, dst)
    assert (
        read_dir(dst) is not None
        and (tmp_path / "target_fp8" / "tokenizer.json").exists()
        == (tiny_assets / "target" / "tokenizer.json").exists()
    )
    plain, q = load_file(f"{src}/model.safetensors"), load_file(f"{dst}/model.safetensors")
    proj = [k for k in plain if ".layers." in k and plain[k].dim() == 2]
    assert proj and facts["fp8_projections"] == len(proj)
    for k in proj:  # the reference's quantisation, block by block
        rq, rs = ref_quantise(plain[k])
        assert q[k].dtype == torch.float8_e4m3fn and torch.equal(q[fp8.scale_key(k)], rs)
        assert torch.equal(ref_dequantise(q[k], q[fp8.scale_key(k)]), ref_dequantise(rq, rs))
    assert all(torch.equal(q[k], plain[k]) for k in plain if k not in proj)  # norms, embeddings as trained
    assert facts["fp8_matmul_on_h200"] + facts["dequantised_on_h200"] == len(proj)


def test_the_h384_shapes_do_not_take_the_fp8_matmul_and_say_so():
    facts = acceptance_fp8.fp8_facts("d", [(768, 384), (384, 384), (384, 1152), (1536, 512), (512, 1536)], [])
    assert facts["fp8_matmul_on_h200"] == 2 and facts["dequantised_on_h200"] == 3
    assert facts["shapes_not_fitting"] == ["384x1152", "384x384", "768x384"]
    rows = acceptance_fp8.fp8_facts("d", [(768, 384), (384, 384), (384, 1152)], [], "row")
    assert rows["fp8_matmul_on_h200"] == 3 and rows["scales"] == "row"  # row scales take every h384 shape


def test_the_fp8_scales_reach_the_trainer_and_the_evaluation():
    from trainer.evaluation.run import build_parser as eval_parser

    flags = acceptance_fp8.dtype_flags("fp8", "row")
    args = build_parser().parse_args(["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *flags])
    ev = eval_parser().parse_args(["--target-model", "t", "--drafter", "d", "--prompts", "p", *flags])
    assert args.fp8_scales == ev.fp8_scales == "row"
    assert acceptance_fp8.dtype_flags(None, "row") == []  # a bf16 target takes no scales


def _eval(accepts: list[float], steps: list[int]) -> dict:
    mean = sum(a * s for a, s in zip(accepts, steps, strict=True)) / sum(steps)
    return {
        "mean_accept_len": mean,
        "prompts": len(steps),
        "prompt_accept_len": accepts,
        "prompt_steps": steps,
    }


def test_the_paired_ratios_name_the_serving_dtype_and_the_goal():
    steps = [30, 50, 40, 60]
    bf16 = {"eval": _eval([4.0, 2.0, 3.0, 5.0], steps), "eval_fp8serve": _eval([3.8, 1.9, 2.85, 4.75], steps)}
    fp8 = {
        "eval": _eval([3.96, 1.98, 2.97, 4.95], steps),
        "eval_fp8serve": _eval([3.8, 1.9, 2.85, 4.75], steps),
    }
    res = {"t_block8_dflash": bf16, "t_block8_dflash_fp8cap": fp8}
    keys = ["t_block8_dflash", "t_block8_dflash_fp8cap"]
    out = acceptance_fp8.capture_comparisons(
        res, "t", capture_pairs(parse_specs("8:2:dflash@fp8", "data"), "t"), keys
    )
    assert set(out) == {"t_block8_dflash_fp8cap_vs_8_dflash_bf16serve", "t_block8_dflash_fp8cap_vs_8_dflash_fp8serve",
                        "t_block8_dflash_fp8serve_vs_bf16serve", "t_block8_dflash_fp8cap_fp8serve_vs_bf16serve"}  # fmt: skip
    b = out["t_block8_dflash_fp8cap_vs_8_dflash_bf16serve"]
    assert b["ratio"] == pytest.approx(0.99) and b["serve"] == "bf16" and b["ratio_meets_goal"]
    assert b["ci95"][0] == pytest.approx(0.99) and b["ci95_low_meets_goal"]  # every prompt 0.99 x
    assert out["t_block8_dflash_fp8cap_vs_8_dflash_fp8serve"]["ratio"] == pytest.approx(1.0)
    served = out["t_block8_dflash_fp8serve_vs_bf16serve"]
    assert served["ratio"] == pytest.approx(0.95) and not served["ratio_meets_goal"]
    json.dumps(out)  # results.json takes it
    del res["t_block8_dflash_fp8cap"]["eval_fp8serve"]  # not evaluated (yet): no pair
    out = acceptance_fp8.capture_comparisons(res, "t", [("t_block8_dflash", "t_block8_dflash_fp8cap")], keys)
    assert "t_block8_dflash_fp8cap_vs_8_dflash_fp8serve" not in out and len(out) == 2


def test_the_command_lines_of_the_fp8_drafter_and_of_fp8_serving(tmp_path, monkeypatch):
    from bench import bench_acceptance as ba

    launched = []
    monkeypatch.setattr(ba.subprocess, "Popen", lambda argv, **kw: launched.append(argv))
    work, cfg = (
        str(tmp_path),
        {**ba.TINY, "est_anchors": 0, "est_holdout": 0, "anchor_run": 1, "eval_shards": 2},
    )
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "prompts.jsonl").write_text(
        "".join(f'{{"input_ids": [{i}]}}\n' for i in range(4))
    )
    fp8, plain = parse_spec("8:2:dflash@fp8"), parse_spec("8:2:dflash")
    ba.start_drafter(cfg, work, work, fp8, 0)
    ba.start_drafter(cfg, work, work, plain, 0)
    train_fp8, train_bf16 = launched
    assert train_fp8[train_fp8.index("--target-model") + 1] == f"{work}/target_fp8"
    assert train_fp8[train_fp8.index("--target-dtype") + 1] == "fp8"
    assert train_bf16[train_bf16.index("--target-model") + 1] == f"{work}/target"
    assert "--target-dtype" not in train_bf16  # the bf16 twin's command line is as before
    launched.clear()
    ba.start_eval(cfg, work, work, plain, serve="fp8")
    ba.start_eval(cfg, work, work, plain)
    served, bf16 = launched[:2], launched[2:]
    assert len(served) == 2 == len(bf16)  # two shards each, the same prompts
    for argv in served:
        assert argv[argv.index("--target-model") + 1] == f"{work}/target_fp8"
        assert "--no-baseline" in argv and "--save-outputs" not in argv
        assert argv[argv.index("--target-dtype") + 1] == "fp8"
    assert all("--target-dtype" not in a and "--save-outputs" in a for a in bf16)
    assert [a[a.index("--prompts") + 1] for a in served] == [a[a.index("--prompts") + 1] for a in bf16]
