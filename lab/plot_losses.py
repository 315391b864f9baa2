"""Loss and acceptance-estimate curves of several drafter runs side by side (issue 21: DFlash 1 vs 2).

    python lab/plot_losses.py OUT.png LABEL=RUN_DIR_OR_METRICS [LABEL=...]

Left: the drafter's DFlash loss by step (a DFlash 2 run's step ``loss`` is the DFlash loss plus its
``selector_loss``: the selector's part is taken out so the curves compare the same thing; its own loss is
drawn dashed). Right: ``accept_len_est`` by step. Needs matplotlib.
"""

from __future__ import annotations

import gzip
import json
import os
import sys


def steps(path: str) -> list[dict]:
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    out = []
    with (
        gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")
    ) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("kind") == "step" and r.get("loss") is not None:
                out.append(r)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.2))
    for spec in argv[1:]:
        label, path = spec.split("=", 1)
        st = steps(path)
        x = [r["step"] for r in st]
        sel = [r.get("selector_loss") for r in st]
        line = ax_loss.plot(
            x, [r["loss"] - (s or 0.0) for r, s in zip(st, sel, strict=True)], lw=0.6, label=label
        )
        if any(s is not None for s in sel):
            ax_loss.plot(x, sel, lw=0.6, ls="--", color=line[0].get_color(), label=f"{label}: selector loss")
        ax_acc.plot(x, [r.get("accept_len_est") for r in st], lw=0.8, label=label)
    ax_loss.set(xlabel="step", ylabel="DFlash loss", title="loss")
    ax_acc.set(xlabel="step", ylabel="tokens per block", title="accept_len_est (running mean)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[0], dpi=110)
    print(argv[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
