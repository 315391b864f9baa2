"""The run's settings (trainer/run/settings.py): one frozen object with the flags' names, resolved once (defaults,
a resumed checkpoint's drafter, the rules naming their flags), handed to the workers as JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.support.model_util import tiny_target_config
from tests.support.trainer_run import tiny_flags
from trainer.drafting.config import DraftConfig
from trainer.run.flags import RESOLVABLE, FlagError, build_parser, flag_for_setting, target_info
from trainer.run.settings import (
    Settings,
    parse_worker_argv,
    resolve,
    resolve_drafter,
    worker_argv,
)


def _resolve(tiny, tmp_path, *extra) -> Settings:
    return resolve(build_parser().parse_args(tiny_flags(tiny, tmp_path / "out", *extra)))


def test_the_fields_are_the_flags():
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert {f.name for f in dataclasses.fields(Settings)} == dests
    assert {r.name for r in RESOLVABLE} <= dests
    assert all(r.flag == "--" + r.name.replace("_", "-") for r in RESOLVABLE)


def test_frozen_and_the_same_after_the_workers_json(tiny_assets, tmp_path):
    s = _resolve(
        tiny_assets, tmp_path, "--target-layer-ids", "1,2", "--arch", "dflash2", "--selector-rank", "8"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.block_size = 4
    assert s.target_layer_ids == (1, 2) and s.arch == "dflash2" and s.selector_rank == 8
    argv = worker_argv(s)
    assert argv[0] == "--settings" and json.loads(argv[1])["block_size"] == 8
    back = parse_worker_argv(argv)
    assert back == s and resolve(back) is back  # a worker takes them as they came: nothing re-resolved
    assert back.devices() == s.devices()
    flags = parse_worker_argv(tiny_flags(tiny_assets, tmp_path / "out"))  # torchrun's workers: the flags
    assert not isinstance(flags, Settings) and resolve(flags).block_size == 8


def test_run_json_drafter_record_names_the_resolved_settings(tiny_assets, tmp_path):
    argv = [a for a in tiny_flags(tiny_assets, tmp_path / "out") if a not in ("--block-size", "8")]
    rec = resolve(build_parser().parse_args(argv)).drafter_record()
    assert rec == {
        "arch": "dflash",
        "block_size": 16,
        "num_draft_layers": 1,
        "mask_token_id": None,
        "conv_kernel_size": None,
        "conv_group_size": None,
        "selector_rank": None,
        "selector_top_k": None,
    }


def test_a_resume_takes_the_checkpoints_drafter_unless_given(tiny_assets):
    info = target_info(str(tiny_assets / "target"))
    unset = {r.name: None for r in RESOLVABLE}
    saved = {
        "architectures": ["DFlash2DraftModel"],
        "num_hidden_layers": 3,
        "block_size": 12,
        "dflash_config": {"mask_token_id": 7, "conv_kernel_size": 3, "selector_rank": 64},
    }
    got = resolve_drafter(unset, info, saved)
    inherited = {"arch": "dflash2", "block_size": 12, "num_draft_layers": 3, "mask_token_id": 7}
    assert got == {**unset, **inherited, "conv_kernel_size": 3, "selector_rank": 64}
    # given flags win; an explicit --arch dflash takes none of the DFlash 2 fields (they would be refused)
    got = resolve_drafter({**unset, "arch": "dflash", "block_size": 4}, info, saved)
    assert (got["arch"], got["block_size"], got["num_draft_layers"], got["selector_rank"]) == (
        "dflash",
        4,
        3,
        None,
    )
    # a fresh start: the table's defaults (DFlash 2's block 8)
    assert resolve_drafter({**unset, "arch": "dflash2"}, info, None)["block_size"] == 8


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        (dict(block_size=1), "--block-size"),
        (dict(target_layer_ids=[0, 40]), "--target-layer-ids"),
        (dict(mask_token_id=10**6), "--mask-token-id"),
        (dict(num_draft_layers=2, layer_types=["full_attention"]), "--layer-types"),
        (dict(layer_types=["sliding_attention"], sliding_window=-1), "--sliding-window"),
        (dict(arch="dflash2", dflash2={"conv_kernel_size": 9}, block_size=4), "--conv-kernel-size"),
        (dict(arch="dflash2", dflash2={"selector_top_k": 10**7}), "--selector-top-k"),
    ],
)
def test_a_drafter_config_error_names_the_flag_of_its_rule(kwargs, flag):
    with pytest.raises(ValueError) as e:
        DraftConfig.from_target_config(tiny_target_config(), **kwargs)
    assert flag_for_setting(e.value) == flag


def test_a_target_config_error_names_the_target():
    with pytest.raises(ValueError) as e:  # 4 heads are no multiple of 3: the target's own sizes
        DraftConfig.from_target_config(tiny_target_config(num_key_value_heads=3))
    assert flag_for_setting(e.value) == "--target-model"
    assert flag_for_setting(ValueError("block_size in a message is not a setting")) == "--target-model"


def test_rules_name_their_flag(tiny_assets, tmp_path):
    with pytest.raises(FlagError) as e:
        _resolve(tiny_assets, tmp_path, "--eval-every", "1")
    assert e.value.flag == "--eval-data"
    with pytest.raises(FlagError) as e:
        _resolve(tiny_assets, tmp_path, "--gamma", "0")
    assert e.value.flag == "--gamma"
    with pytest.raises(FlagError) as e:  # held-out sequences that nothing would measure
        _resolve(tiny_assets, tmp_path, "--est-holdout", "4", "--est-anchors", "0")
    assert e.value.flag == "--est-holdout"


def test_max_anchors_is_bounded_by_the_token_budget(tiny_assets, tmp_path):
    with pytest.raises(FlagError) as e:  # 10**20 anchors in a micro-batch of 1024 tokens
        _resolve(
            tiny_assets,
            tmp_path,
            "--max-anchors",
            str(10**20),
            "--token-budget",
            "1024",
            "--max-seq-len",
            "256",
        )
    assert e.value.flag == "--max-anchors" and "exceeds --token-budget 1024" in str(e.value)


def test_a_drafter_too_big_for_the_machine_is_a_config_error_not_a_memory_error():
    with pytest.raises(ValueError) as e:
        DraftConfig.from_target_config(tiny_target_config(), num_draft_layers=10**12)
    assert flag_for_setting(e.value) == "--num-draft-layers"
    with pytest.raises(ValueError, match="more than this machine's memory"):
        DraftConfig.from_target_config(tiny_target_config(hidden_size=400_000, intermediate_size=800_000))
