"""Every drafter by both evaluators on the same held-out prompts: z-lab's ``dflash_generate`` (zlab_eval.py, in
the z-lab venv) and ``python -m trainer.evaluate --json --no-baseline`` (acceptance only: the speed figures of
this bench are the trainers'), both greedy, fp32 on the CPU, one thread each."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

from bench.peers import install

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = 128


def export_dir(drafter: str) -> str:
    """A drafter directory z-lab's class loads: a peer's export as it is; a run directory of ours: its last
    checkpoint's ``export/`` (docs/run-directory.md)."""
    if os.path.isfile(os.path.join(drafter, "config.json")):
        return drafter
    steps = sorted(glob.glob(os.path.join(drafter, "checkpoints", "step_*", "export")))
    if not steps:
        raise SystemExit(f"{drafter}: no config.json and no checkpoints/step_*/export")
    return steps[-1]


def zlab_argv(work: str, drafter: str, s: dict) -> list[str]:
    drafter = export_dir(drafter)
    return [install.python("dflash"), os.path.join(os.path.dirname(__file__), "zlab_eval.py"), "--target",
            os.path.join(work, "target"), "--drafter", drafter, "--prompts",
            os.path.join(work, "heldout", "prompts.jsonl"), "--num-prompts", str(s["prompts"]), "--prompt-len",
            str(PROMPT), "--max-new-tokens", str(s["new"]), "--device", s["eval_device"]]  # fmt: skip


def ours_argv(work: str, drafter: str, s: dict) -> list[str]:
    return [sys.executable, "-m", "trainer.evaluate", "--target-model", os.path.join(work, "target"), "--drafter",
            drafter, "--prompts", os.path.join(work, "heldout", "prompts.jsonl"), "--num-prompts",
            str(s["prompts"]), "--max-new-tokens", str(s["new"]), "--prompt-len", str(PROMPT), "--device",
            s["eval_device"], "--ignore-eos", "--json", "--no-baseline"]  # fmt: skip


def start(argv: list[str], log: str) -> tuple:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT
    e["OMP_NUM_THREADS"] = "1"
    with open(log, "w") as err:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=e, cwd=ROOT)
    return p, log


def finish(started: tuple) -> dict:
    p, log = started
    out, _ = p.communicate()
    if p.returncode != 0 or not out.strip():
        with open(log, errors="replace") as f:
            return {"rc": p.returncode, "stderr": f.read()[-2000:]}
    keep = ("prompts", "prompt_accept_len", "prompt_steps", "mean_accept_len", "mean_accept_len_se",
            "verify_steps", "histogram", "per_position", "new_tokens", "spec_tok_s", "seconds", "evaluator")  # fmt: skip
    rep = json.loads(out.strip().splitlines()[-1])
    return {k: rep[k] for k in keep if k in rep}


def evaluate_all(work: str, out: str, drafters: dict[str, str], s: dict, parallel: int = 2) -> dict:
    """{name: {"zlab": report, "ours": report}}: ``parallel`` evaluations at a time."""
    jobs = [(n, ev, (zlab_argv if ev == "zlab" else ours_argv)(work, d, s)) for n, d in drafters.items()
            for ev in ("zlab", "ours")]  # fmt: skip
    res: dict = {n: {} for n in drafters}
    running: list = []
    for n, ev, argv in jobs:
        running.append((n, ev, start(argv, os.path.join(out, f"eval_{n}_{ev}.log"))))
        if len(running) >= parallel:
            n0, ev0, st = running.pop(0)
            res[n0][ev0] = finish(st)
    for n0, ev0, st in running:
        res[n0][ev0] = finish(st)
    return res
