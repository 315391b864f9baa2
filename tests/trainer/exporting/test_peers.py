"""The peers' formats (trainer/exporting/peers.py) on recorded real output (tests/data/peers/README.md):
SpecForge's ``export --to hf`` and speculators' DFlash / DFlash 2 read as our drafter config; ``--check`` on
speculators' format as vLLM 0.32 loads it (and z-lab / SGLang, which have no reader for it); ``--to
speculators`` / ``--to zlab`` round trips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainer.exporting import check_dir
from trainer.exporting.convert import convert
from trainer.exporting.peers import FormatError, read_config
from trainer.exporting.problems import failed
from trainer.exporting.reader import ReadError
from trainer.model import config_from_json

PEERS = Path(__file__).resolve().parents[2] / "data" / "peers"
SPECFORGE, SPEC1, SPEC2 = "specforge-0.2.0-dflash", "speculators-0.9.0-dflash", "speculators-0.9.0-dflash2"


def _copy(name: str, tmp_path: Path, edit=None) -> Path:
    dst = tmp_path / name
    shutil.copytree(PEERS / name, dst)
    if edit is not None:
        conf = json.loads((dst / "config.json").read_text())
        edit(conf)
        (dst / "config.json").write_text(json.dumps(conf))
    return dst


@pytest.mark.parametrize("name", [SPECFORGE, SPEC1, SPEC2])
def test_a_peers_export_reads_as_the_drafter_it_was_built_as(name):
    """Each was built for the tiny target: 1 layer, block 8, after target layer 3 (speculators' aux id 4),
    mask 127; speculators' DFlash 2 with its convolution and selector sizes."""
    ours, fmt = read_config(str(PEERS / name), n_target=6)
    cfg = config_from_json(ours)
    assert fmt == ("zlab" if name == SPECFORGE else "speculators")
    assert (cfg.num_draft_layers, cfg.block_size, cfg.target_layer_ids, cfg.mask_token_id) == (1, 8, [3], 127)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (
        64,
        4,
        2,
        128,
    )
    assert cfg.arch == ("dflash2" if name == SPEC2 else "dflash") and cfg.layer_types == ["full_attention"]
    if name == SPEC2:
        assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank, cfg.selector_top_k) == (
            2,
            16,
            8,
            4,
        )


def test_what_our_drafter_cannot_compute_is_refused_with_the_reason(tmp_path):
    # speculators' default DFlash 1 layers: sliding, trained causal within the block
    with pytest.raises(FormatError, match="sliding_window_non_causal is false with sliding layers"):
        read_config(str(PEERS / "speculators-0.9.0-dflash-sliding"), 6)
    cases = [
        (lambda c: c.update(sample_from_anchor=True), "predicts from the anchor slot"),
        (lambda c: c.update(draft_vocab_size=64), "a pruned draft vocabulary"),
        (lambda c: c.update(speculators_model_type="eagle3"), 'speculators_model_type "eagle3"'),
        (lambda c: c.update(aux_hidden_state_layer_ids=[0]), "aux_hidden_state_layer_ids is \\[0\\]"),
        (lambda c: c.pop("transformer_layer_config"), "transformer_layer_config is null"),
    ]
    for i, (edit, said) in enumerate(cases):
        with pytest.raises(FormatError, match=said):
            read_config(str(_copy(SPEC1, tmp_path / str(i), edit)), 6)
    with pytest.raises(FormatError, match="SpecForge's Domino"):
        read_config(
            str(_copy(SPECFORGE, tmp_path, lambda c: c["dflash_config"].update(projector_type="domino")))
        )

    # the same layers rewritten in z-lab's layout, no is_causal: z-lab's class runs them causal
    def sliding(c):
        c.update(layer_types=["sliding_attention"] * c["num_hidden_layers"], sliding_window=64)

    with pytest.raises(FormatError, match="sliding layers and no is_causal"):
        read_config(str(_copy(SPECFORGE, tmp_path / "zlab-sliding", sliding)))
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(" " * (1 << 21))
    with pytest.raises(ReadError, match="more than a config can be"):
        read_config(str(tmp_path / "big"))


def _lines(results: dict) -> dict[str, list[str]]:
    return {s: [p.line(s) for p in problems] for s, problems in results.items()}


def test_check_reads_speculators_format_as_vllm_loads_it(tmp_path):
    # SpecForge's export is the z-lab layout: every server reads it
    assert not any(failed(p) for p in check_dir(str(PEERS / SPECFORGE), ["zlab", "vllm", "sglang"]).values())
    r = check_dir(str(PEERS / SPEC2), ["zlab", "vllm", "sglang"])
    assert not failed(r["vllm"]), _lines(r)
    assert failed(r["zlab"]) and failed(r["sglang"])
    assert "z-lab's from_pretrained parses config.json as a flat Qwen3Config" in r["zlab"][0].message
    assert "SGLang (0.5.23) has no reader" in r["sglang"][0].message and "--to zlab" in r["sglang"][0].message
    # DFlash 1 as speculators writes it: its full layer trained bidirectional, and vLLM 0.32 applies
    # sliding_window_non_causal false (dflash_config.causal true) to every layer: served causal
    r = check_dir(str(PEERS / SPEC1), ["vllm"])
    (err,) = [p for p in r["vllm"] if p.severity == "error"]
    assert err.key == "sliding_window_non_causal" and "layer(s) [0] causal" in err.message
    fixed = _copy(SPEC1, tmp_path, lambda c: c.update(sliding_window_non_causal=True))
    assert not failed(check_dir(str(fixed), ["vllm"])["vllm"])
    # vLLM's own structure checks, and what the vLLM rules find, named by the speculators key
    edits = {
        "speculators_config.verifier": lambda c: c["speculators_config"].pop("verifier"),
        "speculators_config.proposal_methods": lambda c: c["speculators_config"]["proposal_methods"][
            0
        ].update(speculative_tokens=5),
        "mask_token_id": lambda c: c.update(mask_token_id=300),
        "transformer_layer_config.num_key_value_heads": lambda c: c["transformer_layer_config"].update(
            num_key_value_heads=3
        ),
    }
    for i, (key, edit) in enumerate(edits.items()):
        got = check_dir(str(_copy(SPEC2, tmp_path / str(i), edit)), ["vllm"])["vllm"]
        assert key in [p.key for p in got if p.severity == "error"], (key, [p.line("vllm") for p in got])


def test_export_to_speculators_round_trips_and_checks_ok(exports, tmp_path):
    src = exports["dflash2"]
    want = config_from_json(json.loads((src / "config.json").read_text()))
    assert convert(str(src), str(tmp_path / "spec"), "speculators", verifier="org/target") == "zlab"
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    real = json.loads((PEERS / SPEC2 / "config.json").read_text())
    # the keys speculators itself writes (less its version stamp and auto_map) and the same nesting
    assert set(real) - set(spec) == {"speculators_version", "auto_map", "transformers_version"}
    assert spec["aux_hidden_state_layer_ids"] == [i + 1 for i in want.target_layer_ids]
    assert spec["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == want.block_size - 1
    assert (tmp_path / "spec" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    ours, fmt = read_config(str(tmp_path / "spec"), want.num_target_layers)
    assert fmt == "speculators" and config_from_json(ours) == want
    assert not failed(check_dir(str(tmp_path / "spec"), ["vllm"])["vllm"])
    # and back to the z-lab layout, which every server reads
    with pytest.raises(ReadError, match="pass --target"):
        convert(str(tmp_path / "spec"), str(tmp_path / "z"), "zlab")
    convert(str(tmp_path / "spec"), str(tmp_path / "z"), "zlab", n_target=want.num_target_layers)
    back = json.loads((tmp_path / "z" / "config.json").read_text())
    assert config_from_json(back) == want
    assert not any(failed(p) for p in check_dir(str(tmp_path / "z"), ["zlab", "vllm", "sglang"]).values())
    with pytest.raises(ReadError, match="not empty"):
        convert(str(src), str(tmp_path / "spec"), "speculators", verifier="org/target")
