"""``trainer.prepare --report DATA_DIR``: the prepared data as the trainer will see it."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from tests.support.chat_tokenizer import qwen3_chat_tokenizer
from trainer.data.dataset import Plan, load_dir
from trainer.data.tokenizing import ChatOptions, main, prepare


def _conversations(n: int) -> list[dict]:
    out = []
    for k in range(n):
        answer = " ".join(str(j) for j in range(k * 7 % 90))
        think = f"<think>\nstep {k}\n</think>\n\n" if k % 2 else ""
        out.append(
            {
                "messages": [
                    {"role": "user", "content": f"count to {k}"},
                    {"role": "assistant", "content": think + answer},
                ]
            }
        )
    return out + [{"prompt": "a b ", "completion": "c d"}]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    raw = d / "in.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in _conversations(40)))
    prepare(
        qwen3_chat_tokenizer(),
        [str(raw)],
        str(d / "data"),
        shard_size=15,
        options=ChatOptions(thinking="mask"),
    )
    return d / "data"


def _sequences(data_dir):
    return [json.loads(x) for f in sorted(data_dir.glob("*.jsonl")) for x in f.read_text().splitlines()]


def test_report_json_counts_the_trainers_view(data, capsys):
    budget, max_len = 512, 200
    assert (
        main(["--report", str(data), "--json", "--token-budget", str(budget), "--max-seq-len", str(max_len)])
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    seqs = _sequences(data)
    kept = [s for s in seqs if any(s["loss_mask"][1:max_len])]
    assert r["files"] == 3 and r["sequences"] == len(kept) == 41
    assert r["tokens"] == sum(min(len(s["input_ids"]), max_len) for s in kept)
    assert r["trained_tokens"] == sum(sum(s["loss_mask"][:max_len]) for s in kept)
    assert r["truncated"] == sum(len(s["input_ids"]) > max_len for s in seqs) > 0
    assert sum(b["count"] for b in r["histogram"]) == r["sequences"]
    assert r["length"]["max"] == max_len
    roles = r["roles"]
    assert roles["assistant"]["coverage"] == 1.0 and roles["completion"]["coverage"] == 1.0
    assert roles["user"]["coverage"] == roles["template"]["coverage"] == roles["prompt"]["coverage"] == 0.0
    assert roles["thinking"]["tokens"] > 0 and roles["thinking"]["trained"] == 0  # --thinking mask
    assert sum(c["tokens"] for c in roles.values()) == sum(len(s["input_ids"]) for s in seqs)
    # packing: the trainer's own plan for these flags
    flags = argparse.Namespace(seed=0, epochs=1, token_budget=budget, max_batch_size=64, est_holdout=0)
    plan = Plan.from_flags(load_dir(str(data), max_len), flags)
    pk = r["packing"]
    assert pk["micro_batches"] == plan.total >= math.ceil(r["tokens"] / budget)
    assert pk["efficiency"] == pytest.approx(r["tokens"] / (plan.total * budget))
    # a smaller --max-batch-size caps the sequences per micro-batch: more of them, lower efficiency
    assert (
        main(
            [
                "--report",
                str(data),
                "--json",
                "--token-budget",
                str(budget),
                "--max-seq-len",
                str(max_len),
                "--max-batch-size",
                "2",
            ]
        )
        == 0
    )
    small = json.loads(capsys.readouterr().out)["packing"]
    assert small["micro_batches"] >= math.ceil(r["sequences"] / 2) and small["efficiency"] < pk["efficiency"]


def test_report_text_has_histogram_bars_and_errors_exit_2(data, tmp_path, capsys):
    assert main(["--report", str(data), "--token-budget", "1024", "--max-seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    bars = [ln for ln in out.splitlines() if ln.startswith("  ") and "-" in ln.split()[0]]
    counts = [int(ln.split()[-1].replace(",", "")) for ln in bars]
    assert len(bars) > 1 and sum(counts) == 41
    top = max(counts)
    for ln, c in zip(bars, counts, strict=True):
        assert ln.count("█") == round(40 * c / top)
    assert "packing at --token-budget 1024" in out and "thinking" in out
    assert main(["--report", str(tmp_path), "--json"]) == 2
    assert "holds no *.jsonl" in capsys.readouterr().err
    assert main(["--report", str(data), "--token-budget", "100", "--max-seq-len", "200"]) == 2
    assert "--max-seq-len" in capsys.readouterr().err
