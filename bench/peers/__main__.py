"""``python -m bench.peers run``: ours against SpecForge and speculators on the same work (issue 56).

    .venv/bin/python -m bench.peers run --steps 50 --out /tmp/peers_smoke          # CPU smoke (~10 min)
    .venv/bin/python -m bench.peers run --steps 2000 --out bench/out/peers/cpu     # the CPU row
    python3 -m bench.peers run --device cuda:0 --steps 3000 --tokens 16384 --wheels DIR --out $OUT  # one H200

Phases (each result lands in ``--out``/results.json as it comes, logs beside it):
1. install: each peer in its own venv (bench/peers/install.py);
2. prepare (bench/peers/prepare.py): the stdlib corpus's training chunks and held-out prompts, the dense
   stdlib-style Qwen3 byte target (bench/acceptance_target.py, trained once, reused by a later run of the same
   settings), its hidden states in SpecForge's ``.ckpt`` and speculators' ``hs_I.safetensors`` layouts (timed:
   the peers' capture);
3. train, alternating ours and a peer: ours with data-token labels, SpecForge, ours with soft labels
   (``--use-soft-labels``, forward KL), speculators with ``--loss-fn kl_div``; the same steps, tokens a step,
   anchors, block, layers, target layers, mask token, learning rate and schedule;
4. export each peer's drafter to z-lab's layout; evaluate every drafter with z-lab's loop and ``trainer.evaluate``
   on the same held-out prompts (bench/peers/evaluate.py);
5. report (bench/peers/report.py): acceptance, paired ratios ours/peer with 95% bootstrap intervals over
   prompts, end-to-end tok/s (capture included), drafter-step tok/s, peak RSS, the load average beside each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.peers import evaluate, install, ours, peer_specforge, peer_speculators, prepare, report  # noqa: E402

PEERS = ("specforge", "speculators")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="install, prepare, train, evaluate, report")
    r.add_argument("--out", required=True, help="results.json, table.md and the logs")
    r.add_argument("--work", default=None, help="features, runs, exports (default OUT/work)")
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--tokens", type=int, default=2048, help="tokens a step (whole 512-token chunks)")
    r.add_argument("--anchors", type=int, default=128, help="blocks a step")
    r.add_argument("--chunks", type=int, default=1200, help="training chunks of 512 bytes")
    r.add_argument("--prompts", type=int, default=32, help="held-out prompts per evaluation")
    r.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    r.add_argument("--device", default="cpu", help="cpu or cuda:0 (bf16 and FlexAttention where each has it)")
    r.add_argument("--threads", type=int, default=2, help="torch threads of each trainer (CPU)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument(
        "--target-steps", type=int, default=None, help="default 200 on the CPU (tiny target), 1200 on a GPU"
    )
    r.add_argument(
        "--parallel",
        action="store_true",
        help="train all at once (each one thread on a CPU): the same shared load for every trainer",
    )
    r.add_argument("--only", default="ours_hard,specforge,ours_soft,speculators", help="trainers to run")
    r.add_argument("--wheels", default=None, help="install the peers from this folder of wheels (no index)")
    r.add_argument("--eval-parallel", type=int, default=2)
    e = sub.add_parser(
        "evaluate", help="evaluate trained drafters of a run again (or before the others finish)"
    )
    e.add_argument("--out", required=True, help="the run's --out (its results.json gives the settings)")
    e.add_argument("--only", required=True, help="drafters to evaluate, e.g. ours_hard,specforge")
    e.add_argument("--eval-parallel", type=int, default=2)
    t = sub.add_parser("report", help="the report and table of a run from its files")
    t.add_argument("--out", required=True)
    return p


def evaluated(out: str) -> dict:
    """Evaluations made by ``evaluate`` (evals_side.json), by drafter."""
    path = os.path.join(out, "evals_side.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def evaluate_cmd(a) -> int:
    """Evaluate the named drafters of a run into ``evals_side.json`` (the run itself rewrites results.json)."""
    out = os.path.abspath(a.out)
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    s, work = res["settings"], res.get("work") or os.path.join(out, "work")
    paths = {
        n: os.path.join(work, f"run_{n}" if n.startswith("ours") else f"export_{n}")
        for n in a.only.split(",")
    }
    side = evaluated(out)
    side.update(evaluate.evaluate_all(work, out, paths, s, a.eval_parallel))
    with open(os.path.join(out, "evals_side.json"), "w") as f:
        json.dump(side, f, indent=1)
    return report_cmd(a)


def report_cmd(a) -> int:
    """The report and table from results.json, evaluations from ``evaluate`` filling those the run lacks."""
    out = os.path.abspath(a.out)
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    ev = res.setdefault("eval", {})
    for n, e in evaluated(out).items():
        if not all("prompt_steps" in (ev.get(n, {}).get(k) or {}) for k in ("zlab", "ours")):
            ev[n] = e
    res["report"] = report.build(res)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    table = report.table(res)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


def settle(a) -> dict:
    if a.tokens % prepare.SEQ or a.tokens < prepare.SEQ:
        raise SystemExit(f"--tokens must be a multiple of {prepare.SEQ}")
    for flag in ("steps", "anchors", "chunks", "prompts", "new", "threads"):
        if getattr(a, flag) < 1:
            raise SystemExit(f"--{flag} must be >= 1")
    gpu = a.device != "cpu"
    return {"device": a.device, "eval_device": a.device, "threads": a.threads, "steps": a.steps,
            "tokens": a.tokens, "seq": prepare.SEQ, "seqs_per_step": a.tokens // prepare.SEQ,
            "anchors": a.anchors, "block": 8, "layers": 2, "layer_ids": [1, 5] if gpu else [0, 2], "mask": 257, "lr": 1e-3,
            "warmup": 0.04, "gamma": 7.0, "epochs": 1000, "seed": a.seed, "log_every": 10,
            "prompts": a.prompts, "new": a.new, "chunks": a.chunks,
            "size": "full" if gpu else "tiny", "target_steps": a.target_steps or (1200 if gpu else 200),
            "parallel": a.parallel}  # fmt: skip


def run(a) -> int:
    s = settle(a)
    out = os.path.abspath(a.out)
    work = os.path.abspath(a.work or os.path.join(out, "work"))
    os.makedirs(work, exist_ok=True)
    res: dict = {"settings": s, "work": work, "command": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "machine": {"cpus": os.cpu_count(), "load_avg_start": list(os.getloadavg())}}  # fmt: skip
    path = os.path.join(out, "results.json")

    def save() -> None:
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    names = [x for x in a.only.split(",") if x]
    with open(os.path.join(out, "install.log"), "a") as log:
        res["versions"] = {
            p: install.install(p, a.wheels, log) for p in (*[x for x in PEERS if x in names], "dflash")
        }
    save()
    ps = prepare.settings(s["size"], s["seed"], s["chunks"], s["prompts"], s["target_steps"], s["device"])
    text = prepare.prepare_text(work, ps)
    res["corpus"] = text["corpus"]
    t0 = time.monotonic()
    res["target"] = prepare.target(work, ps, text)
    res["target_seconds"] = time.monotonic() - t0
    save()
    which = tuple(x for x in PEERS if x in names)
    if which:
        load0 = list(os.getloadavg())
        table = (lambda: peer_speculators.dataset(work, out)) if "speculators" in which else None
        res["capture"] = {**prepare.write_features(work, s["layer_ids"], which, table), "load_avg_start": load0,
                          "load_avg_end": list(os.getloadavg())}  # fmt: skip
        save()
    res["train"], drafters = {}, {}
    if s["parallel"]:  # all at once, under one shared load
        from concurrent.futures import ThreadPoolExecutor

        print(
            f"[bench.peers] training {names} at once ({s['steps']} steps x {s['tokens']} tokens)", flush=True
        )
        with ThreadPoolExecutor(len(names)) as pool:
            futs = {n: pool.submit(train_one, n, work, out, s, res) for n in names}
            drafters = {n: f.result() for n, f in futs.items()}
        save()
    for name in [] if s["parallel"] else names:  # alternating: ours, a peer, ours, the other peer
        print(f"[bench.peers] training {name} ({s['steps']} steps x {s['tokens']} tokens)", flush=True)
        drafters[name] = train_one(name, work, out, s, res)
        save()
    res["eval"] = evaluate.evaluate_all(
        work, out, {k: v for k, v in drafters.items() if v}, s, a.eval_parallel
    )
    save()
    res["report"] = report.build(res)
    save()
    table = report.table(res)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


def train_one(name: str, work: str, out: str, s: dict, res: dict) -> str | None:
    """Train one, record it (without its output lines), return the drafter to evaluate (None if it failed).
    An earlier run's directories of it in ``work`` are removed first (a fresh start, no resume)."""
    for d in (f"run_{name}", f"export_{name}"):
        shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    if name.startswith("ours"):
        r, run_dir = ours.train(work, out, s, soft=name == "ours_soft")
        r.pop("lines")
        r.update(ours.speeds(run_dir) if r["rc"] == 0 else {})
        res["train"][name] = r
        return run_dir if r["rc"] == 0 else None
    mod = peer_specforge if name == "specforge" else peer_speculators
    r = mod.train(work, out, s)
    r.update(report.peer_speeds(r.pop("lines"), name, s))
    res["train"][name] = r
    if r["rc"] != 0:
        return None
    ex, dest = mod.export(work, out, s)
    ex.pop("lines")
    r["export"] = ex
    return dest if ex["rc"] == 0 else None


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return {"run": run, "evaluate": evaluate_cmd, "report": report_cmd}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
