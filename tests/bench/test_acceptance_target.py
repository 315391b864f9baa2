"""bench/acceptance_target.py: the bench's dense and hybrid byte-level targets, and the forced PyTorch path a
hybrid trains through even where flash-linear-attention's kernels are bound (its backward refuses on Hopper)."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch

from bench import acceptance_target as at

SAME = ("hidden", "layers", "heads", "kv", "head_dim", "inter")


@pytest.mark.parametrize("size", ["full", "small", "tiny"])
def test_dense_h384_has_the_hybrids_width_and_depth(size):
    dense, hybrid = at.target_dims(size, "qwen3", "h384"), at.target_dims(size, "qwen3_5")
    assert hybrid["shape"] == "h384" and at.target_tag(hybrid) == "qwen3_5_h384"
    assert {k: dense[k] for k in SAME} == {k: hybrid[k] for k in SAME}
    assert hybrid["layers"] == 8  # 2 x (3 + 1) at every size: the trainer's default target layers agree
    assert at.target_dims(size, "qwen3")["shape"] == "d512"


def test_a_hybrid_has_only_the_h384_shape_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="only the h384"):
        at.target_dims("full", "qwen3_5", "d512")
    with pytest.raises(ValueError, match="--target-arch"):
        at.target_dims("full", "llama", None)
    with pytest.raises(ValueError, match="--target-shape"):
        at.target_dims("full", "qwen3", "h999")


def test_the_full_hybrid_config_is_the_issues_target():
    cfg = at.target_config(at.target_dims("full", "qwen3_5"))
    assert cfg.model_type == "qwen3_5_text"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.eos_token_id) == (384, 8, 260, 256)
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25


def test_a_saved_tiny_hybrid_is_a_hybrid_target_to_the_trainer(tmp_path):
    from trainer.run.flags import is_hybrid, target_info

    model = at.build_target(at.target_dims("tiny", "qwen3_5"), "cpu", 0)
    model.save_pretrained(tmp_path)
    info = target_info(str(tmp_path))
    assert info["model_type"] == "qwen3_5_text" and is_hybrid(info)


# -- the forced PyTorch path --------------------------------------------------------------------------------
def _fake_package(name: str, attrs: dict) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


@pytest.fixture
def kernels_bound(monkeypatch):
    """A private copy of transformers' Qwen3.5 modeling module imported while fake ``fla`` and
    ``causal_conv1d`` packages are installed: its wrappers bind the fakes, which count their calls and then
    compute what the PyTorch functions do. (calls, module)"""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as real

    calls: dict[str, int] = {}

    def fake(name, torch_fn):
        @functools.wraps(torch_fn)  # its signature: the wrapper passes on the arguments it names
        def kernel(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return torch_fn(*args, **kwargs)

        return kernel

    unwrapped = {n: getattr(real, n).__wrapped__ for n in at.LINEAR_FUNCTIONS}
    rule = {"chunk_gated_delta_rule": unwrapped["torch_chunk_gated_delta_rule"],
            "fused_recurrent_gated_delta_rule": unwrapped["torch_recurrent_gated_delta_rule"]}  # fmt: skip
    gdr = _fake_package("fla.ops.gated_delta_rule", {k: fake(k, f) for k, f in rule.items()})
    ops = _fake_package("fla.ops", {"gated_delta_rule": gdr})
    conv = {k: fake(k, unwrapped[k]) for k in ("causal_conv1d_fn", "causal_conv1d_update")}
    for name, mod in (("fla", _fake_package("fla", {"ops": ops})), ("fla.ops", ops),
                      ("fla.ops.gated_delta_rule", gdr), ("causal_conv1d", _fake_package("causal_conv1d", conv))):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location(
        "transformers.models.qwen3_5._bench_kernels_copy", real.__file__
    )
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copy)
    spec.loader.exec_module(copy)
    return calls, copy


def _loss_and_grad(module, seed: int = 0):
    cfg = at.target_config(at.target_dims("tiny", "qwen3_5"))
    torch.manual_seed(seed)
    model = module.Qwen3_5ForCausalLM(cfg)
    x = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(1))  # 2 chunks of 64
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return float(loss.detach()), model.model.layers[0].linear_attn.in_proj_qkv.weight.grad.clone()


def test_forcing_runs_the_torch_functions_where_kernels_are_bound(kernels_bound):
    calls, module = kernels_bound
    bound_loss, bound_grad = _loss_and_grad(module)
    assert calls.get("chunk_gated_delta_rule") and calls.get("causal_conv1d_fn")  # the fakes were bound
    calls.clear()
    with at.torch_linear_path(module):
        loss, grad = _loss_and_grad(module)
    assert calls == {}  # no kernel ran: the torch functions did, forward and backward
    assert loss == pytest.approx(bound_loss, rel=1e-6) and torch.allclose(grad, bound_grad, atol=1e-6)
    _loss_and_grad(module)  # on exit the bound kernels are back
    assert calls.get("chunk_gated_delta_rule")


def test_forcing_refuses_a_module_laid_out_otherwise():
    other = types.ModuleType("transformers.models.qwen3_5.elsewhere")
    other.torch_chunk_gated_delta_rule = lambda *a, **k: None
    with pytest.raises(RuntimeError, match="causal_conv1d_fn"), at.torch_linear_path(other):
        pass
