"""Ours with a packed row of several documents against one document a micro-batch (the same tokens and blocks a
step, ``--grad-accum``), two ``trainer.pipeline`` runs side by side under one load: where the CPU step time goes
(bench/README.md, "The peers bench"). Needs a run's work directory (its target and data).

    PYTHONPATH=. .venv/bin/python bench/peers/packing_ab.py STEPS WORK OUT_JSON
"""

import json
import os
import sys
import threading

sys.path.insert(0, ".")
from bench.peers import __main__ as M
from bench.peers import launch, ours

work = sys.argv[2]
a = M.build_parser().parse_args(
    ["run", "--out", "x", "--steps", sys.argv[1], "--tokens", "1024", "--anchors", "64", "--threads", "1"]
)
s = M.settle(a)
res = {}


def go(name, extra):
    run = os.path.join(os.path.join(os.path.dirname(os.path.abspath(sys.argv[3])), "packing_ab"), name)
    argv = ours.argv(work, run, s, False)
    if extra:
        i = argv.index("--token-budget")
        argv[i + 1] = "512"
        i = argv.index("--max-anchors")
        argv[i + 1] = "32"
        argv += ["--grad-accum", "2"]
    r = launch.run(
        argv,
        os.path.join(os.path.dirname(os.path.abspath(sys.argv[3])), "packing_ab", name + ".log"),
        env=ours.env(s),
        cwd=".",
    )
    r.pop("lines")
    r.update(ours.speeds(run))
    res[name] = r


os.makedirs(os.path.join(os.path.dirname(os.path.abspath(sys.argv[3])), "packing_ab"), exist_ok=True)
ts = [threading.Thread(target=go, args=(n, e)) for n, e in (("packed_1x1024", False), ("split_2x512", True))]
[t.start() for t in ts]
[t.join() for t in ts]
with open(sys.argv[3], "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps(res, indent=1))
