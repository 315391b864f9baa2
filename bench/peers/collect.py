"""The peers bench's CPU results file (bench/results/peers_cpu_2026-12-06.json) from its runs' results.json files
(bench/README.md gives each run's command) and packing_ab.py's output, with the pairs across runs.

    PYTHONPATH=. .venv/bin/python bench/peers/collect.py
"""

import json
import sys

sys.path.insert(0, ".")
from trainer.evaluation.report import paired_ratio

B = "bench/out/peers/"


def read(path):
    with open(path) as f:
        return json.load(f)


def load(n):
    try:
        return json.load(open(B + n + "/results.json"))
    except OSError:
        return None


L, SF, SA, HA = load("long"), load("long_spec_full"), load("long_soft_alone"), load("long_hard_alone")
cmd = ".venv/bin/python -m bench.peers run --steps 2000 --tokens 1024 --anchors 64 --chunks 600 --prompts 32 --new 128 --threads 1"
out = {
    "issue": 56,
    "machine": "this CPU (2 cores shared), torch 2.13.0 CPU",
    "date": "2026-12-06",
    "runs": {
        "parallel": {
            "command": cmd + " --parallel --eval-parallel 4 --out bench/out/peers/long",
            "results": L,
        },
        "speculators_full_attention_alone": {
            "command": cmd
            + " --only speculators --out bench/out/peers/long_spec_full --work bench/out/peers/long/work",
            "results": SF,
        },
        "ours_soft_alone": {
            "command": cmd
            + " --only ours_soft --out bench/out/peers/long_soft_alone --work bench/out/peers/long/work",
            "results": SA,
        },
        "ours_hard_then_specforge_alone": {
            "command": cmd
            + " --only ours_hard,specforge --out bench/out/peers/long_hard_alone --work bench/out/peers/long/work",
            "results": HA,
        },
    },
    "packing_ab": {
        "what": "ours (trainer.pipeline, data labels) 200 steps x 1024 tokens x 64 blocks, two runs side by side under the same load: one packed row of 2 documents a step (--token-budget 1024 --max-anchors 64) against one document a micro-batch (--token-budget 512 --max-anchors 32 --grad-accum 2)",
        "results": read(B + "packing_ab.json"),
    },
}
pairs = {}
if SF:
    for ev in ("zlab", "ours"):
        pairs[f"ours_soft_over_speculators_full_attention_{ev}"] = paired_ratio(
            SF["eval"]["speculators"][ev], L["eval"]["ours_soft"][ev]
        )
if HA and "eval" in HA:
    for ev in ("zlab", "ours"):
        try:
            pairs[f"alone_ours_hard_over_specforge_{ev}"] = paired_ratio(
                HA["eval"]["specforge"][ev], HA["eval"]["ours_hard"][ev]
            )
        except KeyError:
            pass
out["pairs"] = pairs
with open("bench/results/peers_cpu_2026-12-06.json", "w") as f:
    json.dump(out, f, indent=1, default=str)
for k, v in pairs.items():
    print(k, round(v["ratio"], 4), [round(x, 4) for x in v["ci95"]])
