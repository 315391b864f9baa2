"""A PNG of a run's tok/s and hidden-state queue depth over time, from its metrics.jsonl.

    python bench/plot_run.py RUN/metrics.jsonl out.png [--title TEXT]

Top: headline tok/s (sum over drafters) and each device's tok/s from the ``throughput`` records (0.5 s
intervals) plus a 10 s moving mean of the headline; step records' tokens over time as the run's own count.
Bottom: queue depth and capacity. Time is seconds since the ``started`` event. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json


def load(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = load(a.metrics)
    start = next((r["t"] for r in recs if r.get("name") == "started"), recs[0]["t"])
    thr = [r for r in recs if r.get("kind") == "throughput"]
    steps = [r for r in recs if r.get("kind") == "step"]
    t = [r["t"] - start for r in thr]
    head = [sum(d["tok_s"] for d in r["devices"] if d["role"] == "drafter") for r in thr]
    fig, (ax1, ax2) = plt.subplots(
        2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    keys = sorted({(d["role"], d["device"]) for r in thr for d in r["devices"]})
    for role, dev in keys:
        ys = [
            next((d["tok_s"] for d in r["devices"] if (d["role"], d["device"]) == (role, dev)), 0.0)
            for r in thr
        ]
        ax1.plot(t, ys, lw=0.6, alpha=0.5, label=f"{role} {dev}")
    win = 20  # 10 s of 0.5 s records
    mean = [
        sum(head[max(0, i - win + 1) : i + 1]) / len(head[max(0, i - win + 1) : i + 1])
        for i in range(len(head))
    ]
    ax1.plot(t, mean, lw=2.0, color="black", label="headline (drafters), 10 s mean")
    if len(steps) > 2:
        st = [s["t"] - start for s in steps]
        own = [
            (steps[i]["tokens"]) / (steps[i]["t"] - steps[i - 1]["t"])
            if steps[i]["t"] > steps[i - 1]["t"]
            else 0
            for i in range(1, len(steps))
        ]
        k = 10
        sm = [
            sum(own[max(0, i - k + 1) : i + 1]) / len(own[max(0, i - k + 1) : i + 1]) for i in range(len(own))
        ]
        ax1.plot(st[1:], sm, lw=1.2, ls="--", color="tab:red", label="step records, 10-step mean")
    ax1.set_ylabel("tok/s")
    ax1.legend(fontsize=7, loc="lower right")
    ax1.grid(alpha=0.3)
    if a.title:
        ax1.set_title(a.title, fontsize=10)
    ax2.step(t, [r["queue"]["depth"] for r in thr], where="post", color="tab:blue", label="queue depth")
    ax2.plot(t, [r["queue"]["capacity"] for r in thr], color="gray", ls=":", label="capacity")
    ax2.set_ylabel("batches")
    ax2.set_xlabel("seconds since start")
    ax2.legend(fontsize=7, loc="upper left")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png, dpi=80)
    print(f"wrote {a.png}", flush=True)


if __name__ == "__main__":
    main()
