"""The effect of ``--labels`` / ``--divergence`` on real acceptance, at matched steps (issue 56; CPU).

    PYTHONPATH=. python lab/labels_effect.py --out /tmp/le_out                    # ~50 min on a loaded CPU
    PYTHONPATH=. python lab/labels_effect.py --out /tmp/le_kb --only '' --keep-best-every 25   # keep-best (~10 min)

The dense byte-level Qwen3 target of bench/bench_acceptance.py at its tiny CPU shape (4 layers, hidden 64),
trained here on the stdlib corpus (seeded); one drafter per objective (data, target-argmax, target-dist with
kl, reverse-kl, jsd, tv), each ``python -m trainer.pipeline`` with the same flags, seed, data and steps; each
evaluated by ``python -m trainer.evaluate`` (greedy, acceptance only) on the same held-out prompts; every
objective paired with ``data`` over the prompts (``report.paired_ratio``: ratio of mean acceptance, 95%
bootstrap interval). ``--keep-best-every N``: a ``data`` drafter evaluated every N steps with ``--keep-best`` (the
same target, reused from ``--work``). One process at a time, one thread each. Writes ``results.json`` and the
logs to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import acceptance_target  # noqa: E402
from bench.bench_acceptance import MASK, SEQ, chunks, corpus, heldout_chunks, write_jsonl  # noqa: E402
from trainer.evaluation.report import paired_ratio  # noqa: E402

OBJECTIVES = {
    "data": ["--labels", "data"],
    "target-argmax": ["--labels", "target-argmax"],
    "kl": ["--labels", "target-dist", "--divergence", "kl"],
    "reverse-kl": ["--labels", "target-dist", "--divergence", "reverse-kl"],
    "jsd": ["--labels", "target-dist", "--divergence", "jsd"],
    "tv": ["--labels", "target-dist", "--divergence", "tv"],
}


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
    return e


def train(a, work: str, out: str, name: str, extra: tuple[str, ...] = (), tag: str = "") -> dict:
    run = os.path.join(work, f"run_{name}{tag}")
    argv = [sys.executable, "-m", "trainer.pipeline", "--target-model", os.path.join(work, "target"),
            "--data-dir", os.path.join(work, "data"), "--output-dir", run, "--target-gpus", "cpu",
            "--drafter-gpus", "cpu", "--block-size", "8", "--num-draft-layers", "1", "--max-anchors", "256",
            "--token-budget", str(a.budget), "--max-seq-len", str(SEQ), "--gamma", "7", "--mask-token-id",
            str(MASK), "--log-every", "50", "--resume", "none", "--max-steps", str(a.steps), "--epochs", "50",
            "--lr", "1e-3", "--warmup-ratio", "0.04", "--seed", str(a.seed), "--save-every-minutes", "0",
            *OBJECTIVES[name], *extra]  # fmt: skip
    t0 = time.monotonic()
    with open(os.path.join(out, f"train_{name}{tag}.log"), "w") as log:
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        recs = [json.loads(x) for x in f]
    st = [r for r in recs if r.get("kind") == "step"]
    evals = [{k: r.get(k) for k in ("step", "accept_len", "accept_len_se", "per_position", "best")}
             for r in recs if r.get("kind") == "eval"]  # fmt: skip
    return {"rc": rc, "seconds": time.monotonic() - t0, "steps": len(st), "loss": st[-1]["loss"] if st else None,
            "accept_len_est": st[-1].get("accept_len_est") if st else None,
            **({"evals": evals} if evals else {})}  # fmt: skip


def keep_best_run(a, work: str, out: str) -> dict:
    """One ``data`` drafter evaluated every ``--keep-best-every`` steps on the held-out prompts (``--eval-every
    1 --keep-best``): its evaluations, the one ``checkpoints/best`` names and the last."""
    extra = ("--save-every", str(a.keep_best_every), "--keep-checkpoints", "1", "--eval-every", "1",
             "--eval-data", os.path.join(work, "heldout"), "--eval-prompts", str(a.prompts),
             "--eval-new-tokens", str(a.new_tokens), "--keep-best")  # fmt: skip
    d = train(a, work, out, "data", extra, tag="_keep_best")
    with open(os.path.join(work, "run_data_keep_best", "checkpoints", "best")) as f:
        d["best_checkpoint"] = f.read().strip()
    return d


def evaluate(a, work: str, out: str, name: str) -> dict:
    argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", os.path.join(work, "target"),
            "--drafter", os.path.join(work, f"run_{name}"), "--prompts", os.path.join(work, "heldout"),
            "--num-prompts", str(a.prompts), "--max-new-tokens", str(a.new_tokens), "--prompt-len", "128",
            "--device", "cpu", "--ignore-eos", "--no-baseline", "--json"]  # fmt: skip
    with open(os.path.join(out, f"eval_{name}.log"), "w") as log:
        p = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env(), cwd=ROOT, check=False
        )
    if p.returncode != 0:
        return {"rc": p.returncode}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/labels_effect")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-size", choices=("tiny", "small"), default="tiny", help="bench's target dims")
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per drafter")
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--only", default=",".join(OBJECTIVES), help="comma-separated objectives ('' for none)")
    ap.add_argument(
        "--keep-best-every",
        type=int,
        default=0,
        help="also a --keep-best run evaluated every N steps (0: none)",
    )
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # one thread, as the trainer and evaluation processes (env())
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    res: dict = {"command": sys.argv, "config": vars(a), "drafters": {}, "vs_data": {}}

    def save() -> None:
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.monotonic()
    tr, held, _ = corpus(None)
    write_jsonl(os.path.join(a.work, "data", "train.jsonl"), chunks(tr, a.chunks, a.seed))
    write_jsonl(os.path.join(a.work, "heldout", "prompts.jsonl"), heldout_chunks(held, a.prompts, a.seed))
    if not os.path.isfile(os.path.join(a.work, "target", "config.json")):
        dims = acceptance_target.target_dims(a.target_size, "qwen3", "d512")
        sched = {"steps": a.target_steps, "batch": 16, "device": "cpu"}
        res["target"] = acceptance_target.train_target(
            dims, sched, tr, chunks(held, 64, a.seed + 1), os.path.join(a.work, "target"), a.seed
        )
    res["target_seconds"] = time.monotonic() - t0
    save()
    evals = {}
    for name in [x for x in a.only.split(",") if x]:
        d = train(a, a.work, a.out, name)
        e = evaluate(a, a.work, a.out, name)
        evals[name] = e
        d.update({k: e.get(k) for k in ("mean_accept_len", "mean_accept_len_se", "per_position")})
        d["eval_rc"] = e.get("rc", 0)
        res["drafters"][name] = d
        if name != "data" and "data" in evals and "prompt_steps" in e and "prompt_steps" in evals["data"]:
            res["vs_data"][name] = paired_ratio(evals["data"], e)
        print(f"{name}: {json.dumps(d)}", flush=True)
        save()
    if a.keep_best_every:
        res["keep_best"] = keep_best_run(a, a.work, a.out)
        print(f"keep-best: {json.dumps(res['keep_best'])}", flush=True)
    res["total_seconds"] = time.monotonic() - t0
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
