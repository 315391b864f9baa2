"""Real exports of tiny drafters (``save_drafter`` on CPU), built once per session, and ``variant`` to copy
one and change its config.json or weights."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

SWA_TYPES = ["sliding_attention"] * 4 + ["full_attention"]  # the SpecForge Qwen3.6-27B recipe's pattern


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Path]:
    """``dflash`` (DFlash 1, 2 layers, bf16), ``dflash2`` (DFlash 2) and ``swa`` (5 layers [S, S, S, S, F],
    window 2048, block 16): each a directory written by ``save_drafter``."""
    import torch

    from tests.support.model_util import tiny_drafter, tiny_target_config
    from trainer.model import save_drafter

    root = tmp_path_factory.mktemp("exports")
    target8 = tiny_target_config(num_hidden_layers=8)
    builds = {
        "dflash": dict(block_size=8, target_layer_ids=[1, 2]),
        "dflash2": dict(
            block_size=8,
            target_layer_ids=[0, 2],
            arch="dflash2",
            dflash2={"selector_rank": 8, "selector_top_k": 4},
        ),
        "swa": dict(
            target_config=target8,
            num_draft_layers=5,
            block_size=16,
            layer_types=SWA_TYPES,
            sliding_window=2048,
        ),
    }
    out = {}
    for name, kw in builds.items():
        drafter, cfg = tiny_drafter(**kw)
        save_drafter(drafter, cfg, root / name, dtype=torch.bfloat16 if name == "dflash" else None)
        out[name] = root / name
    return out


@pytest.fixture
def variant(exports, tmp_path):
    """``variant(name, edit=None)``: a copy of export ``name`` whose config dict ``edit`` changes in place."""

    made = itertools.count()

    def make(name: str, edit=None) -> Path:
        dst = tmp_path / f"{name}_{next(made)}"
        shutil.copytree(exports[name], dst)
        if edit is not None:
            conf = json.loads((dst / "config.json").read_text())
            edit(conf)
            (dst / "config.json").write_text(json.dumps(conf))
        return dst

    return make
