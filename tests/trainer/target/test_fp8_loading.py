"""FP8 checkpoints in Qwen's block-128 layout read by the trainer's loader (trainer/target/loading.py): the
linear layers as stored (checked against the tests' own block-by-block dequantisation, shapes not multiples
of 128), broken scales refused naming the tensor, ``modules_to_not_convert`` kept, ``--target-dtype``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.support.model_util import tiny_target
from tests.support.trainer_run import tiny_flags
from tests.trainer.target.fp8_ref import ref_dequantise, write_fp8
from trainer.run import fp8_config
from trainer.run.flags import FlagError, build_parser, check_target, target_info
from trainer.run.settings import resolve
from trainer.target.capture import load_target
from trainer.target.fp8 import Fp8Linear

BROKEN = "model.layers.1.mlp.down_proj.weight_scale_inv"


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Path:
    """A 2-layer Qwen3 whose projections are (80 | 160 | 400) x (160 | 400): partial blocks both ways."""
    d = tmp_path_factory.mktemp("odd")
    tiny_target(hidden_size=160, intermediate_size=400, head_dim=40, num_hidden_layers=2).save_pretrained(
        d / "bf16"
    )
    return d


def _fp8(odd: Path, name: str, **kw) -> tuple[str, dict]:
    dst = odd / name
    return str(dst), write_fp8(str(odd / "bf16"), str(dst), **kw)


def test_fp8_checkpoint_loads_as_stored_and_dequantises_like_the_reference(odd):
    path, stored = _fp8(odd, "fp8")
    model = load_target(path, "cpu", torch.float32, [0, 1], need_final_hidden=True)
    assert len(stored) == 14  # q k v o gate up down, two layers
    for key, (q, s) in stored.items():
        m = model.get_submodule(key.removesuffix(".weight"))
        assert isinstance(m, Fp8Linear), key
        assert torch.equal(m.weight.view(torch.uint8), q.view(torch.uint8)), key
        assert torch.equal(m.weight_scale_inv, s), key
        assert torch.equal(m.dequantised(), ref_dequantise(q, s)), key
    plain = load_file(str(odd / "bf16" / "model.safetensors"))
    for key, t in model.state_dict().items():
        if key not in stored and not key.endswith("weight_scale_inv"):
            assert torch.equal(t, plain[key]), key  # norms, embeddings, lm_head: as they were
    as_bf16 = load_target(path, "cpu", torch.float32, [0, 1], need_final_hidden=True, target_dtype="bf16")
    for key, (q, s) in stored.items():
        lin = as_bf16.get_submodule(key.removesuffix(".weight"))
        assert type(lin) is nn.Linear and torch.equal(lin.weight, ref_dequantise(q, s)), key
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the FP8 layers' reference forward is the dequantised model's, exactly
        torch.testing.assert_close(model(input_ids=ids).logits, as_bf16(input_ids=ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("broken", "words"),
    [
        ({"drop_scale": BROKEN}, "the checkpoint has no " + BROKEN),
        ({"scale_shape": BROKEN}, BROKEN + ": shape (3, 4), expected (2, 4)"),
        ({"scale_dtype": BROKEN}, BROKEN + ": dtype torch.bfloat16, expected torch.float32"),
    ],
)
@pytest.mark.parametrize("target_dtype", [None, "bf16"])  # read as stored, or dequantised on read
def test_a_missing_or_wrong_scale_is_refused_naming_it(odd, broken, words, target_dtype):
    path, _ = _fp8(odd, f"broken-{next(iter(broken))}", **broken)
    with pytest.raises(ValueError, match=re.escape(words)):
        load_target(path, "cpu", torch.float32, [0, 1], target_dtype=target_dtype)
    load_target(path, "cpu", torch.float32, [0])  # layer 1 is not loaded: its scale is not read


def test_modules_to_not_convert_stay_in_the_models_dtype(odd):
    kept, listed = "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"
    path, stored = _fp8(odd, "keep", keep=(kept,), listed=(listed,))
    model = load_target(path, "cpu", torch.float32, [0, 1])
    plain = load_file(str(odd / "bf16" / "model.safetensors"))
    k = model.get_submodule(kept)
    assert type(k) is nn.Linear and torch.equal(k.weight, plain[kept + ".weight"])  # stored bf16: as is
    li = model.get_submodule(listed)  # stored FP8 but listed: a bf16 layer of the dequantised weight
    assert type(li) is nn.Linear and torch.equal(li.weight, ref_dequantise(*stored[listed + ".weight"]))
    assert isinstance(model.get_submodule("model.layers.1.mlp.down_proj"), Fp8Linear)


def test_quantise_on_load_is_refused_on_the_cpu(odd):
    with pytest.raises(ValueError, match="the CPU has no FP8 matmul"):
        load_target(str(odd / "bf16"), "cpu", torch.float32, [0], target_dtype="fp8")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("weight_block_size", [64, 64]),
        ("fmt", "e5m2"),
        ("activation_scheme", "static"),
        ("scale_fmt", "ue8m0"),
    ],
)
def test_an_fp8_variant_this_trainer_does_not_run_is_refused_naming_the_field(odd, field, value):
    path, _ = _fp8(odd, f"variant-{field}")
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"][field] = value
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(FlagError, match=f"quantization_config.{field}") as e:
        target_info(path)
    assert e.value.flag == "--target-model"
    with pytest.raises(ValueError, match=f"quantization_config.{field}"):
        load_target(path, "cpu", torch.float32, [0])


def test_modules_to_not_convert_matching_follows_transformers():
    cfg = fp8_config.Fp8Config(not_convert=("lm_head", "model.layers.1", r"model\.layers\.\d+\.mlp\.gate"))
    assert not cfg.converts("lm_head")
    assert not cfg.converts("model.layers.1.mlp.up_proj") and cfg.converts("model.layers.11.mlp.up_proj")
    assert not cfg.converts("model.layers.3.mlp.gate") and cfg.converts("model.layers.3.mlp.gate_proj")


def test_target_dtype_flag(tiny_assets, odd, tmp_path):
    with pytest.raises(FlagError, match="CPU has no FP8 matmul") as e:
        resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "a", "--target-dtype", "fp8")))
    assert e.value.flag == "--target-dtype"
    assert resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "b"))).target_dtype is None
    path, _ = _fp8(odd, "flag")
    args = build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "c", "--target-dtype", "fp8"))
    info = target_info(path)
    assert info["fp8"] and not target_info(str(odd / "bf16"))["fp8"]
    check_target(args, info, cuda=False)  # an FP8 checkpoint on the CPU: runs dequantised
