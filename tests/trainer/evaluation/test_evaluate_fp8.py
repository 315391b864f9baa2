"""``python -m trainer.evaluate --target-dtype`` and ``--fp8-scales``: resolved per target and device, refused
with the reason where the device cannot run FP8 (or the target runs bf16), and recorded in the JSON report (the
tiny target, in process)."""

from __future__ import annotations

import json

import pytest

from tests.support.model_util import saved_random_drafter
from tests.trainer.target.fp8_ref import write_fp8
from trainer.evaluation.load import EvalError, resolve_target_dtype
from trainer.evaluation.run import main


@pytest.fixture(scope="module")
def drafter(tiny_assets, tmp_path_factory):
    return saved_random_drafter(tiny_assets / "target", tmp_path_factory.mktemp("drafter"))


def _evaluate(capsys, target, drafter, prompts, *extra) -> tuple[int, dict | None, str]:
    argv = ["--target-model", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--num-prompts", "2", "--max-new-tokens", "8", "--device", "cpu", "--no-baseline", "--json", *extra]  # fmt: skip
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out.strip().splitlines()[-1]) if rc == 0 else None), cap.err


def test_fp8_on_the_cpu_with_a_bf16_checkpoint_is_refused_with_the_reason(tiny_assets, drafter, capsys):
    rc, _, err = _evaluate(
        capsys, tiny_assets / "target", drafter, tiny_assets / "data", "--target-dtype", "fp8"
    )
    assert rc == 2 and "error: --target-dtype: target dtype fp8 on the CPU" in err and "no FP8 matmul" in err


def test_a_bf16_checkpoint_is_served_as_before_and_says_bf16(tiny_assets, drafter, capsys):
    rc, rep, _ = _evaluate(capsys, tiny_assets / "target", drafter, tiny_assets / "data")
    assert rc == 0 and rep["target_dtype"] == "bf16" and rep["target_fp8_linears"] == 0


def test_an_fp8_checkpoint_runs_fp8_by_default_and_bf16_when_asked(tiny_assets, drafter, tmp_path, capsys):
    target = tmp_path / "target_fp8"
    write_fp8(str(tiny_assets / "target"), str(target))
    rc, fp8, _ = _evaluate(capsys, target, drafter, tiny_assets / "data")
    assert rc == 0 and fp8["target_dtype"] == "fp8"
    assert fp8["target_fp8_linears"] > 0 and fp8["target_fp8_matmul_linears"] == 0  # the CPU: dequantised
    rc, bf16, _ = _evaluate(capsys, target, drafter, tiny_assets / "data", "--target-dtype", "bf16")
    assert rc == 0 and bf16["target_dtype"] == "bf16" and bf16["target_fp8_linears"] == 0


def test_a_gpu_without_block_scaled_fp8_is_refused_before_loading(tiny_assets, monkeypatch):
    from trainer.target import fp8

    monkeypatch.setattr(fp8, "fp8_unsupported", lambda dev: "cuda:0 (NVIDIA A100) is sm_80: ...")
    with pytest.raises(EvalError, match=r"--target-dtype: target dtype fp8: cuda:0 \(NVIDIA A100\) is sm_80"):
        resolve_target_dtype(str(tiny_assets / "target"), "fp8", "cuda:0")
    assert resolve_target_dtype(str(tiny_assets / "target"), None, "cuda:0") == ("bf16", False)


def test_fp8_scales_row_runs_an_fp8_checkpoint_and_is_refused_for_bf16(
    tiny_assets, drafter, tmp_path, capsys
):
    rc, _, err = _evaluate(
        capsys, tiny_assets / "target", drafter, tiny_assets / "data", "--fp8-scales", "row"
    )
    assert rc == 2 and "error: --fp8-scales row: the target runs in bf16" in err
    target = tmp_path / "target_fp8"
    write_fp8(str(tiny_assets / "target"), str(target))
    rc, rep, _ = _evaluate(capsys, target, drafter, tiny_assets / "data", "--fp8-scales", "row")
    assert rc == 0 and rep["target_dtype"] == "fp8" and rep["fp8_scales"] == "row"
    assert rep["target_fp8_linears"] > 0
    rc, rep, _ = _evaluate(capsys, target, drafter, tiny_assets / "data")
    assert rc == 0 and rep["fp8_scales"] == "block"
