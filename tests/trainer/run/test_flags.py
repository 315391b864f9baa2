"""Bad flags, bad data and a busy run directory are refused at once, naming what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, env, events, tiny_flags
from trainer.run.flags import FlagError, build_parser
from trainer.run.rundir import proc_start_time
from trainer.run.settings import resolve


def _validate(tiny, tmp_path, *extra):
    return resolve(build_parser().parse_args(tiny_flags(tiny, tmp_path / "out", *extra))).devices()


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (("--drafter-gpus", "0,x"), "--drafter-gpus"),
        (("--launch", "single", "--target-gpus", "cpu,cpu"), "--target-gpus"),
        (("--target-gpus", "0", "--drafter-gpus", "cpu"), "--drafter-gpus"),
        (("--drafter-gpus", "0,0"), "--drafter-gpus"),
        (("--launch", "single", "--drafter-gpus", "cpu,cpu"), "--drafter-gpus"),
        (("--target-gpus", "0", "--drafter-gpus", "0,1"), "--drafter-gpus"),
        (("--launch", "multi", "--target-gpus", "0,1", "--drafter-gpus", "1"), "--drafter-gpus"),
        (("--block-size", "1"), "--block-size"),
        (("--max-seq-len", "4096", "--token-budget", "1024"), "--max-seq-len"),
        (("--warmup-ratio", "1.5"), "--warmup-ratio"),
        (("--lr", "0"), "--lr"),
        (("--layer-types", "full_attention,sliding_attention"), "--layer-types"),
        (("--layer-types", "fancy"), "--layer-types"),
        (("--noise-start", "-1"), "--noise-start"),
        (("--resume", "/nonexistent/ckpt"), "--resume"),
    ],
)
def test_inconsistent_flags_name_the_flag(tiny_assets, tmp_path, extra, flag):
    with pytest.raises(FlagError) as e:
        _validate(tiny_assets, tmp_path, *extra)
    assert e.value.flag == flag
    assert str(e.value).startswith(flag)


def test_paths_are_checked(tiny_assets, tmp_path):
    args = build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "o"))
    args.data_dir = str(tmp_path / "missing")
    with pytest.raises(FlagError, match="--data-dir"):
        resolve(args)
    args = build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "o"))
    args.target_model = str(tmp_path)
    with pytest.raises(FlagError, match="--target-model.*config.json"):
        resolve(args)
    assert _validate(tiny_assets, tmp_path).target == ["cpu"]


@pytest.mark.parametrize(
    ("extra", "mode"),
    [
        ((), "single"),
        (("--drafter-gpus", "cpu,cpu"), "multi"),
        (("--launch", "multi"), "multi"),
        (("--target-gpus", "0", "--drafter-gpus", "0"), "single"),
        (("--target-gpus", "0", "--drafter-gpus", "1"), "multi"),
        (("--target-gpus", "0,1", "--drafter-gpus", "1"), "single"),
        (("--target-gpus", "0,1,2", "--drafter-gpus", "3,4", "--launch", "torchrun"), "torchrun"),
    ],
)
def test_launch_mode(tiny_assets, tmp_path, extra, mode):
    assert _validate(tiny_assets, tmp_path, *extra).mode == mode


def _trainer(args, **env_extra):
    return subprocess.run(
        [sys.executable, "-m", "trainer.pipeline", *args],
        cwd=ROOT,
        env=env(**env_extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e
def test_cli_exits_2_naming_the_flag(tiny_assets, tmp_path):
    p = _trainer(tiny_flags(tiny_assets, tmp_path / "o", "--bogus-flag", "1"))
    assert p.returncode == 2 and "--bogus-flag" in p.stderr
    p = _trainer(tiny_flags(tiny_assets, tmp_path / "o", "--epochs", "zero"))
    assert p.returncode == 2 and "--epochs" in p.stderr
    p = _trainer(tiny_flags(tiny_assets, tmp_path / "o", "--launch", "single", "--drafter-gpus", "cpu,cpu"))
    assert p.returncode == 2 and "--drafter-gpus" in p.stderr
    assert not (tmp_path / "o" / "run.json").exists()


@pytest.mark.e2e
def test_a_cuda_index_the_machine_lacks_fails_before_the_run_dir_and_any_worker(tiny_assets, tmp_path):
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # index 0 and 1 on a machine without CUDA (issue 54: two workers started, the error twice, a run dir left)
    lists = ("0", "1") if n == 0 else (str(n), str(n + 1))
    out = tmp_path / "o"
    p = _trainer(tiny_flags(tiny_assets, out, "--target-gpus", lists[0], "--drafter-gpus", lists[1]))
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(
        f"error: --target-gpus: CUDA index {lists[0]} does not"
    )
    assert not out.exists() and "started" not in p.stdout + p.stderr
    p = _trainer(tiny_flags(tiny_assets, out, "--eval-every", "1", "--eval-data", str(tiny_assets / "data"),
                            "--eval-device", f"cuda:{n}"))  # fmt: skip
    assert p.returncode == 2 and p.stderr.startswith("error: --eval-device: CUDA index")
    assert not out.exists()


@pytest.mark.e2e
def test_empty_data_dir_and_malformed_data_are_refused(tiny_assets, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    p = _trainer([*tiny_flags(tiny_assets, tmp_path / "o1"), "--data-dir", str(data)])
    assert p.returncode == 2 and "--data-dir" in p.stderr and "no *.jsonl" in p.stderr
    good = (tiny_assets / "data" / "train.jsonl").read_text().splitlines()[:3]
    (data / "a.jsonl").write_text("\n".join([*good, '{"input_ids": [1, 2, "x"]}']) + "\n")
    out = tmp_path / "o2"
    p = _trainer([*tiny_flags(tiny_assets, out), "--data-dir", str(data)])
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{data / 'a.jsonl'}:4:" in p.stderr and "input_ids" in p.stderr
    ev = events(out)
    assert [e["name"] for e in ev] == ["started", "error", "stopped"]
    assert "a.jsonl:4" in ev[1]["message"] and ev[2]["exit_code"] == 2 and ev[2]["reason"] == "error"


@pytest.mark.e2e
def test_a_live_trainer_in_the_run_dir_is_refused(tiny_assets, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    # this test process plays the live trainer: its pid and kernel start time
    (out / "run.json").write_text(
        json.dumps({"pid": os.getpid(), "start_time": proc_start_time(os.getpid())})
    )
    p = _trainer(tiny_flags(tiny_assets, out))
    assert p.returncode == 2 and "--output-dir" in p.stderr and "live trainer" in p.stderr
    assert not (out / "metrics.jsonl").exists()
    # same pid but another start time: a recycled pid, not our trainer -> would start (checked in-process)
    from trainer.run.rundir import check_not_running

    (out / "run.json").write_text(json.dumps({"pid": os.getpid(), "start_time": 1}))
    check_not_running(str(out))


def test_queue_memory_is_computed_and_a_depth_that_cannot_fit_is_refused():
    from types import SimpleNamespace

    from trainer.runtime.hidden_queue import hidden_batch_bytes, queue_refusal

    # the seed's workflow: 49,152 tokens x 5 captured layers x 5120 x bf16 = 2.5 GB a batch
    cfg = SimpleNamespace(num_captured=5, hidden_size=5120)
    per = hidden_batch_bytes(SimpleNamespace(token_budget=49152, use_soft_labels=False), cfg, 2)
    assert per == 49152 * 5 * 5120 * 2
    assert (
        hidden_batch_bytes(SimpleNamespace(token_budget=49152, use_soft_labels=True), cfg, 2)
        == 49152 * 6 * 5120 * 2
    )
    gb = 10**9
    why = queue_refusal("cuda:1", 60, 1, per, free=140 * gb, total=150 * gb)  # depth 60: 153 GB
    assert why and "cuda:1" in why and "153.51 GB" in why
    fits = int(why.split("--hs-queue-depth ")[1].split()[0])
    assert fits > 0 and queue_refusal("cuda:1", fits, 1, per, free=140 * gb, total=150 * gb) is None
    assert queue_refusal("cuda:1", fits + 1, 1, per, free=140 * gb, total=150 * gb) is not None
    # the reference shape's default depth fits easily
    ref = hidden_batch_bytes(
        SimpleNamespace(token_budget=8192, use_soft_labels=False),
        SimpleNamespace(num_captured=5, hidden_size=4096),
        2,
    )
    assert queue_refusal("cuda:1", 8, 1, ref, free=140 * gb, total=150 * gb) is None


def _parse(tiny, tmp_path, *extra):
    flags = [f for f in tiny_flags(tiny, tmp_path / "out", *extra)]
    i = flags.index("--block-size")
    del flags[i : i + 2]  # the tiny flags set it; these tests look at the defaults
    return resolve(build_parser().parse_args(flags + list(extra)))


def test_drafter_defaults_per_target_family(tiny_assets, tiny_hybrid, tmp_path):
    a = _parse(tiny_assets, tmp_path)
    assert (a.num_draft_layers, a.block_size, a.mask_token_id) == (1, 16, None)
    h = _parse(tiny_hybrid, tmp_path)  # Qwen3.5: 5 layers, block 16, the tokenizer's <|mask|>
    assert (h.num_draft_layers, h.block_size, h.mask_token_id) == (5, 16, 127)
    e = _parse(tiny_hybrid, tmp_path, "--num-draft-layers", "3", "--block-size", "32", "--mask-token-id", "5")
    assert (e.num_draft_layers, e.block_size, e.mask_token_id) == (3, 32, 5)


def test_arch_flags_and_defaults(tiny_assets, tmp_path):
    """DFlash 2's four flags are refused without --arch dflash2; an unset --block-size gets the architecture's
    default (16, or 8 as published for DFlash 2)."""
    with pytest.raises(FlagError) as e:
        _validate(tiny_assets, tmp_path, "--selector-rank", "8")
    assert e.value.flag == "--selector-rank"
    with pytest.raises(FlagError) as e:
        _validate(tiny_assets, tmp_path, "--selector-unary-grad")
    assert e.value.flag == "--selector-unary-grad"
    _validate(tiny_assets, tmp_path, "--arch", "dflash2", "--selector-unary-grad")

    def block_of(*flags):
        argv = list(tiny_flags(tiny_assets, tmp_path / "out", *flags))
        i = argv.index("--block-size")
        del argv[i : i + 2]  # tiny_flags' --block-size 8: leave it unset
        return resolve(build_parser().parse_args(argv)).block_size

    assert block_of() == 16 and block_of("--arch", "dflash2") == 8
    with pytest.raises(SystemExit):
        build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "out", "--arch", "dflash3"))


def test_est_anchors_default_and_refused_values(tiny_assets, tmp_path, capsys):
    parse = build_parser().parse_args
    assert parse(tiny_flags(tiny_assets, tmp_path / "o")).est_anchors == 32
    assert parse(tiny_flags(tiny_assets, tmp_path / "o", "--est-anchors", "0")).est_anchors == 0
    for bad in ("1", "-2"):  # one measuring anchor is no run; negative is nothing
        with pytest.raises(SystemExit):
            parse(tiny_flags(tiny_assets, tmp_path / "o", "--est-anchors", bad))
        assert "--est-anchors" in capsys.readouterr().err


FLOAT_FLAGS = (
    "--lr",
    "--warmup-ratio",
    "--weight-decay",
    "--grad-clip",
    "--gamma",
    "--noise-start",
    "--noise-end",
)


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-Infinity"])
def test_non_finite_float_flags_are_refused_naming_the_flag(tiny_assets, tmp_path, capsys, flag, value):
    """Issue 33: ``--lr nan`` passed every check (NaN compares false) and trained on NaN."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "o", f"{flag}={value}"))
    assert e.value.code == 2
    assert f"argument {flag}: must be a finite number, got {value!r}" in capsys.readouterr().err


def test_every_float_flag_is_checked_for_finite_values():
    floats = {
        a.option_strings[0]
        for a in build_parser()._actions
        if a.type is not None
        and getattr(a.type, "__name__", "") in ("float", "finite_float", "_nonneg_float")
    }
    assert floats == {*FLOAT_FLAGS, "--save-every-minutes"}
    assert all(a.type is not float for a in build_parser()._actions)


@pytest.mark.e2e
def test_the_trainer_exits_2_on_nan_flags(tiny_assets, tmp_path):
    for flag in ("--lr", "--gamma", "--grad-clip"):
        p = _trainer(tiny_flags(tiny_assets, tmp_path / "o", flag, "nan"))
        assert p.returncode == 2 and f"argument {flag}: must be a finite number" in p.stderr, p.stderr
    assert not (tmp_path / "o" / "run.json").exists()
