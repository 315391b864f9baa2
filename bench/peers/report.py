"""The bench's figures from its records: each peer's step rate from its time-stamped log, the paired acceptance
ratios ours/peer (``trainer.evaluation.report.paired_ratio``: 95% bootstrap over prompts), and the table."""

from __future__ import annotations

import re

from trainer.evaluation.report import paired_ratio

# the step counter each peer prints (its log line at every --log-every / log_interval step)
STEP_RE = {"specforge": re.compile(r"^step (\d+): ")}
PAIRS = (
    ("ours_hard", "specforge", "data-token labels"),
    ("ours_soft", "speculators", "soft labels, forward KL"),
)


EPOCH_RE = re.compile(r"Training epoch (\d+)/\d+ (started|completed)")


def speculators_speeds(lines: list[tuple[float, str]], s: dict) -> dict:
    """speculators prints no step lines, only its epochs: the steps' tok/s from the first epoch's start to the last
    epoch's end (its per-epoch validation on 0.1% of the chunks included)."""
    marks = [(t, m.group(2)) for t, line in lines for m in [EPOCH_RE.search(line)] if m]
    starts, ends = [t for t, k in marks if k == "started"], [t for t, k in marks if k == "completed"]
    if not starts or not ends or ends[-1] <= starts[0]:
        return {}
    rate = s["steps"] * s["tokens"] / (ends[-1] - starts[0])
    return {"drafter_step_tok_s": rate, "steady_tok_s": rate, "rate_from": "epoch marks"}


def peer_speeds(lines: list[tuple[float, str]], name: str, s: dict, skip: float = 0.1) -> dict:
    """Steady tok/s of a peer's training (its whole step: feature loading and the drafter step) from the times
    its step lines were printed, past the first ``skip`` of the steps."""
    if name == "speculators":
        return speculators_speeds(lines, s)
    pts, last = [], -1
    for t, line in lines:
        m = STEP_RE[name].search(line)
        if m and int(m.group(1)) > last:
            last = int(m.group(1))
            pts.append((t, last))
    if len(pts) < 3:
        return {"steps_seen": last}
    t0, s0 = next(p for p in pts if p[1] >= pts[-1][1] * skip)
    t1, s1 = pts[-1]
    rate = (s1 - s0) * s["tokens"] / (t1 - t0) if t1 > t0 else None
    return {"steps_seen": s1, "drafter_step_tok_s": rate, "steady_tok_s": rate}


def _acc(res: dict, name: str, ev: str):
    return (res.get("eval", {}).get(name, {}).get(ev) or {}).get("mean_accept_len")


def build(res: dict) -> dict:
    out: dict = {}
    s = res["settings"]
    total_tokens = s["steps"] * s["tokens"]
    cap = res.get("capture", {}).get("seconds")
    for name, r in res.get("train", {}).items():
        peer = not name.startswith("ours")
        wall = r["seconds"] + (cap or 0) if peer else r["seconds"]
        out[name] = {"e2e_tok_s": total_tokens / wall if r.get("rc") == 0 else None,
                     "e2e_seconds": wall, "drafter_step_tok_s": r.get("drafter_step_tok_s"),
                     "steady_tok_s": r.get("steady_tok_s"), "peak_rss_mb": r.get("peak_rss_mb"),
                     "load_avg": [r.get("load_avg_start"), r.get("load_avg_end")],
                     "accept_zlab": _acc(res, name, "zlab"), "accept_ours": _acc(res, name, "ours")}  # fmt: skip
    for mine, peer, _what in PAIRS:
        for ev in ("zlab", "ours"):
            a = res.get("eval", {}).get(peer, {}).get(ev) or {}
            b = res.get("eval", {}).get(mine, {}).get(ev) or {}
            if "prompt_steps" in a and "prompt_steps" in b:
                out[f"{mine}_over_{peer}_{ev}"] = paired_ratio(a, b)
    return out


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _load(x) -> str:
    a, b = x or (None, None)
    return "-" if not a or not b else f"{a[0]:.1f}-{b[0]:.1f}"


def table(res: dict) -> str:
    rep, s = res["report"], res["settings"]
    rows = ["| trainer | labels | acceptance, z-lab loop | acceptance, trainer.evaluate | ours/peer (z-lab) [95%] | "
            "ours/peer (trainer.evaluate) [95%] | end-to-end tok/s | drafter-step tok/s | peak RSS MiB | load avg |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    labels = {
        "ours_hard": "data tokens",
        "specforge": "data tokens",
        "ours_soft": "soft (KL)",
        "speculators": "soft (KL)",
    }
    for mine, peer, _what in PAIRS:
        for name in (mine, peer):
            r = rep.get(name)
            if not r:
                continue
            cells = []
            for ev in ("zlab", "ours"):
                c = rep.get(f"{mine}_over_{peer}_{ev}")
                cells.append(
                    ""
                    if name != peer or not c
                    else f"{c['ratio']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]"
                )
            rows.append(f"| {name} | {labels[name]} | {_f(r['accept_zlab'])} | {_f(r['accept_ours'])} | {cells[0]} | "
                        f"{cells[1]} | {_f(r['e2e_tok_s'], '{:,.0f}')} | {_f(r['drafter_step_tok_s'], '{:,.0f}')} | "
                        f"{_f(r['peak_rss_mb'], '{:,.0f}')} | {_load(r['load_avg'])} |")  # fmt: skip
    head = (f"{s['steps']} steps x {s['tokens']} tokens ({s['anchors']} blocks of {s['block']}), drafter "
            f"{s['layers']} layers, target layers {s['layer_ids']}, {s['prompts']} held-out prompts x {s['new']} new "
            f"tokens, device {s['device']}")  # fmt: skip
    return head + "\n\n" + "\n".join(rows)
