"""Ours: ``python -m trainer.pipeline`` end to end (the target's capture in the run, every step), with the
settings the peers are matched to (bench/peers/peer_*.py): ``--est-anchors 0`` (no measuring blocks beside the
training ones: the peers have none, and they would cost ours ~est/anchors more drafter compute), ``--export-fp32``
(the CPU evaluators run fp32)."""

from __future__ import annotations

import json
import os
import sys

from bench.peers import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def argv(work: str, run: str, s: dict, soft: bool) -> list[str]:
    dev = "0" if s["device"] != "cpu" else "cpu"
    out = [sys.executable, "-m", "trainer.pipeline", "--target-model", os.path.join(work, "target"),
           "--data-dir", os.path.join(work, "data"), "--output-dir", run, "--target-gpus", dev,
           "--drafter-gpus", dev, "--block-size", str(s["block"]), "--num-draft-layers", str(s["layers"]),
           "--target-layer-ids", ",".join(str(i) for i in s["layer_ids"]), "--mask-token-id", str(s["mask"]),
           "--max-anchors", str(s["anchors"]), "--token-budget", str(s["tokens"]), "--max-seq-len", str(s["seq"]),
           "--gamma", str(s["gamma"]), "--log-every", str(s["log_every"]), "--resume", "none",
           "--est-anchors", "0", "--max-steps", str(s["steps"]), "--epochs", str(s["epochs"]), "--lr", str(s["lr"]),
           "--warmup-ratio", str(s["warmup"]), "--seed", str(s["seed"]), "--export-fp32"]  # fmt: skip
    return out + (["--use-soft-labels"] if soft else [])


def env(s: dict) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
    e["OMP_NUM_THREADS"] = str(s["threads"])
    return e


def train(work: str, out: str, s: dict, soft: bool) -> tuple[dict, str]:
    name = "ours_soft" if soft else "ours_hard"
    run = os.path.join(work, f"run_{name}")
    r = launch.run(argv(work, run, s, soft), os.path.join(out, f"train_{name}.log"), env=env(s), cwd=ROOT)
    return r, run


def records(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        recs = [json.loads(x) for x in f if x.strip()]
    starts = [i for i, r in enumerate(recs) if r.get("kind") == "event" and r.get("name") == "started"]
    return recs[starts[-1] :] if starts else recs


def speeds(run: str, skip: float = 0.1) -> dict:
    """From the run's records: steady tok/s over the step records after the first ``skip`` of the steps (the
    whole pipeline: capture and drafter), and the drafter step alone (its throughput records' drafter tok/s over
    its busy fraction, past the same point)."""
    recs = records(run)
    steps = [r for r in recs if r.get("kind") == "step"]
    if len(steps) < 3:
        return {}
    first = steps[int(len(steps) * skip)]
    tail = [r for r in steps if r["step"] > first["step"]]
    toks = sum(r.get("tokens", 0) for r in tail)
    thr = [d for r in recs if r.get("kind") == "throughput" and r["t"] > first["t"] for d in r["devices"]
           if d.get("role") == "drafter" and d.get("busy")]  # fmt: skip
    step_rate = sum(d["tok_s"] for d in thr) / sum(d["busy"] for d in thr) if thr else None
    return {"steady_tok_s": toks / (tail[-1]["t"] - first["t"]) if tail else None, "drafter_step_tok_s": step_rate,
            "steps": steps[-1]["step"], "tokens_total": sum(r.get("tokens", 0) for r in steps),
            "final_loss": steps[-1].get("loss"), "accept_len_est": steps[-1].get("accept_len_est")}  # fmt: skip
