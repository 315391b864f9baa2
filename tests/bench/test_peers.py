"""bench/peers (issue 56): the peers' feature layouts written from the target, speculators' checkpoint read into
z-lab's layout, a peer's step rate from its log, the paired ratios and the table, and the run's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench import acceptance_target as at
from bench.peers import __main__ as peers_main
from bench.peers import prepare, report, speculators_features

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    at.build_target(at.target_dims("tiny", "qwen3"), "cpu", 0).eval().save_pretrained(d)
    return str(d)


def test_capture_takes_each_layers_output_and_the_last_before_the_final_norm(tiny_target):
    from transformers import AutoModelForCausalLM

    seqs = [list(range(5, 37)), list(range(40, 72))]
    got = list(prepare.capture(tiny_target, seqs, [0, 2], batch=2))
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = model(input_ids=torch.tensor(seqs), output_hidden_states=True).hidden_states
    for i, ids, layers, last in got:
        assert ids.tolist() == seqs[i]
        assert torch.allclose(
            layers, torch.cat([hs[1][i], hs[3][i]], -1), atol=1e-5
        )  # z-lab: hidden_states[i + 1]
        # the last layer's own output (what vLLM captures): transformers' last hidden state is after the norm
        assert torch.allclose(model.model.norm(last), hs[-1][i], atol=1e-5)
        assert not torch.allclose(last, hs[-1][i], atol=1e-3)


def test_speculators_features_are_laid_out_as_its_file_transfer_reads_them(tmp_path):
    os.makedirs(tmp_path / "hidden_states")
    ids, layers, last = torch.arange(6), torch.randn(6, 2 * 4), torch.randn(6, 4)
    speculators_features.write(str(tmp_path), 3, ids, layers, last)
    f = load_file(tmp_path / "hidden_states" / "hs_3.safetensors")
    assert f["hidden_states"].shape == (6, 3, 4) and f["token_ids"].tolist() == ids.tolist()
    # speculators' ArrowDataset: [:, :-1].flatten(1) are the drafter's layers, [:, -1] the verifier's last
    assert torch.equal(f["hidden_states"][:, :-1].flatten(1), layers)
    assert torch.equal(f["hidden_states"][:, -1], last)


def test_a_speculators_checkpoint_is_written_in_zlab_layout(tmp_path, tiny_target):
    src, dest = tmp_path / "spec", tmp_path / "zlab"
    src.mkdir()
    layer = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 260}
    cfg = {"transformer_layer_config": layer, "aux_hidden_state_layer_ids": [1, 3], "block_size": 8,
           "mask_token_id": 257, "speculators_config": {"verifier": {"name_or_path": tiny_target}}}  # fmt: skip
    (src / "config.json").write_text(json.dumps(cfg))
    body = {"fc.weight": torch.randn(64, 128, dtype=torch.bfloat16), "norm.weight": torch.ones(64)}
    save_file({**body, "embed_tokens.weight": torch.randn(260, 64), "verifier_norm.weight": torch.ones(64),
               "verifier_lm_head.weight": torch.randn(260, 64)}, src / "model.safetensors")  # fmt: skip
    script = os.path.join(ROOT, "bench", "peers", "speculators_convert.py")
    subprocess.run(
        [sys.executable, script, str(src), str(dest), tiny_target], check=True, capture_output=True
    )
    out = json.loads((dest / "config.json").read_text())
    assert out["dflash_config"] == {
        "target_layer_ids": [0, 2],
        "mask_token_id": 257,
    }  # z-lab = speculators - 1
    assert out["block_size"] == 8 and out["architectures"] == ["DFlashDraftModel"]
    assert out["num_target_layers"] == at.target_dims("tiny", "qwen3")["layers"]
    w = load_file(dest / "model.safetensors")
    assert sorted(w) == ["fc.weight", "norm.weight"] and w["fc.weight"].dtype == torch.float32


def test_a_peers_step_rate_is_read_from_its_time_stamped_step_lines():
    lines = [
        (0.0, "loading"),
        *[(10.0 + i, f"step {10 * i}: {{'loss': 1.0}}") for i in range(11)],
        (30.0, "done"),
    ]
    r = report.peer_speeds(lines, "specforge", {"tokens": 1024})
    assert r["steps_seen"] == 100
    assert r["drafter_step_tok_s"] == pytest.approx(10 * 1024)  # 10 steps a second past the first 10%


def _eval(means: list[float], steps: list[int]) -> dict:
    toks = sum(m * n for m, n in zip(means, steps, strict=True))
    return {"prompts": len(means), "prompt_accept_len": means, "prompt_steps": steps,
            "mean_accept_len": toks / sum(steps)}  # fmt: skip


def test_the_report_pairs_ours_with_each_peer_on_both_evaluators():
    s = peers_main.settle(peers_main.build_parser().parse_args(["run", "--out", "x", "--steps", "10"]))
    run = {
        "rc": 0,
        "seconds": 10.0,
        "peak_rss_mb": 100.0,
        "load_avg_start": [1, 1, 1],
        "load_avg_end": [2, 2, 2],
    }
    res = {"settings": s, "capture": {"seconds": 5.0},
           "train": {n: dict(run) for n in ("ours_hard", "specforge", "ours_soft", "speculators")},
           "eval": {"ours_hard": {"zlab": _eval([2.0, 3.0], [10, 10]), "ours": _eval([2.0, 3.0], [10, 10])},
                    "specforge": {"zlab": _eval([1.0, 3.0], [10, 10]), "ours": _eval([2.0, 3.0], [10, 10])}}}  # fmt: skip
    res["report"] = rep = report.build(res)
    assert rep["ours_hard_over_specforge_zlab"]["ratio"] == pytest.approx(2.5 / 2.0)
    assert rep["ours_hard_over_specforge_ours"]["ratio"] == pytest.approx(1.0)
    assert "ours_soft_over_speculators_zlab" not in rep  # not evaluated: no pair
    # a peer's end to end counts its capture: the same tokens over 10 s of training + 5 s of features
    assert rep["specforge"]["e2e_tok_s"] == pytest.approx(rep["ours_hard"]["e2e_tok_s"] * 10 / 15)
    t = report.table(res)
    assert "| specforge | data tokens | 2.000 | 2.500 | 1.250 [" in t and "1.0-2.0" in t


@pytest.mark.parametrize("argv", [["--tokens", "1000"], ["--steps", "0"]])
def test_the_run_refuses_settings_it_cannot_match(argv):
    with pytest.raises(SystemExit):
        peers_main.settle(peers_main.build_parser().parse_args(["run", "--out", "x", *argv]))


def _settings(*argv: str) -> dict:
    return peers_main.settle(peers_main.build_parser().parse_args(["run", "--out", "x", *argv]))


def test_speculators_runs_dflash_1s_attention_and_enough_epochs_for_its_steps():
    from bench.peers import peer_speculators

    s = _settings("--steps", "2000", "--tokens", "1024", "--chunks", "600")
    argv = peer_speculators.argv("/w", s)

    def after(flag: str, n: int) -> list[str]:
        i = argv.index(flag)
        return argv[i + 1 : i + 1 + n]

    # every layer full attention (its default: sliding windows, causal inside the block), its ids = z-lab's + 1
    assert after("--full-attention-indices", 2) == ["0", "1"]
    assert after("--target-layer-ids", 2) == [str(i + 1) for i in s["layer_ids"]]
    # it caps each epoch at --max-steps but runs every epoch asked for: as many as the steps need, not 1000
    per_epoch = int(600 * 0.999) * 512 // 1024
    assert (peer_speculators.epochs(s) - 1) * per_epoch >= 2000 > (peer_speculators.epochs(s) - 2) * per_epoch


def test_zlab_reads_ours_from_the_runs_last_export(tmp_path):
    from bench.peers import evaluate

    for step in ("step_00000010", "step_00000020"):
        (tmp_path / "checkpoints" / step / "export").mkdir(parents=True)
    assert evaluate.export_dir(str(tmp_path)).endswith("step_00000020/export")
    (tmp_path / "config.json").write_text("{}")  # a peer's export: read as it is
    assert evaluate.export_dir(str(tmp_path)) == str(tmp_path)


def test_report_fills_a_runs_missing_evaluations_from_the_side_ones(tmp_path):
    s = _settings("--steps", "10")
    run = {
        "rc": 0,
        "seconds": 10.0,
        "peak_rss_mb": 1.0,
        "load_avg_start": [1, 1, 1],
        "load_avg_end": [1, 1, 1],
    }
    res = {"settings": s, "train": {"ours_hard": dict(run), "specforge": dict(run)}, "eval": {}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    side = {n: {"zlab": _eval(m, [10, 10]), "ours": _eval(m, [10, 10])}
            for n, m in (("ours_hard", [2.0, 3.0]), ("specforge", [2.0, 2.0]))}  # fmt: skip
    (tmp_path / "evals_side.json").write_text(json.dumps(side))
    assert peers_main.main(["report", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "results.json").read_text())["report"]
    assert rep["ours_hard_over_specforge_ours"]["ratio"] == pytest.approx(1.25)
    assert "1.250 [" in (tmp_path / "table.md").read_text()
