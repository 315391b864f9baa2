"""From per-GPU stage rates and a measured pipeline efficiency to every split of N GPUs (issues 19, 23).

    python3 bench/projection.py OUT/results.json            # prints the Markdown (bench_seeds.py writes it too)

For T target and D = N - T drafter GPUs: ``min(T x capture, D x drafter) x efficiency``, where ``capture``
and ``drafter`` are the tok/s of one GPU running that stage alone and ``efficiency`` is a real pipeline
run's steady-state tok/s over min(its stages alone) on the same machine. The split with the highest figure
is the one the rates favour; its launcher flags are ``--target-gpus 0..T-1 --drafter-gpus T..N-1`` (the
launcher takes any split). What the arithmetic leaves out: the hand-off fan-in of T targets into D
drafters and DDP's gradient all-reduce across D drafters (a run on N GPUs measures those).
"""

from __future__ import annotations

import argparse
import json
import sys

GOAL_TOK_S = 50_000  # issues 19 and 23: 3.4x the seeds' 14.5K on 8 H200s


def gpu_list(first: int, n: int) -> str:
    return ",".join(str(i) for i in range(first, first + n))


def splits(capture: float, drafter: float, efficiency: float, n: int = 8) -> list[dict]:
    """Every split T + D = n (T, D >= 1), in order of T."""
    rows = []
    for t in range(1, n):
        d = n - t
        tt, dd = t * capture, d * drafter
        rows.append(
            {
                "target_gpus": t,
                "drafter_gpus": d,
                "target_tok_s": tt,
                "drafter_tok_s": dd,
                "limited_by": "target" if tt <= dd else "drafter",
                "raw_tok_s": min(tt, dd),
                "projected_tok_s": min(tt, dd) * efficiency,
                "flags": f"--target-gpus {gpu_list(0, t)} --drafter-gpus {gpu_list(t, d)}",
            }
        )
    return rows


def best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: r["projected_tok_s"])


def project(capture: float, drafter: float, efficiency: float, n: int = 8) -> dict:
    rows = splits(capture, drafter, efficiency, n)
    b = best(rows)
    return {
        "gpus": n,
        "capture_tok_s": capture,
        "drafter_tok_s": drafter,
        "efficiency": efficiency,
        "rows": rows,
        "best": {"target_gpus": b["target_gpus"], "drafter_gpus": b["drafter_gpus"]},
        "best_projected_tok_s": b["projected_tok_s"],
        "best_flags": b["flags"],
        "goal_tok_s": GOAL_TOK_S,
        "goal_met": b["projected_tok_s"] >= GOAL_TOK_S,
    }


def markdown(p: dict, source: str = "") -> str:
    """The projection as a Markdown table (the best split in bold) with the inputs above it."""
    lines = [
        f"Projection for {p['gpus']} GPUs{(' (' + source + ')') if source else ''}: capture "
        f"**{p['capture_tok_s']:,.0f}** tok/s per target GPU, drafter **{p['drafter_tok_s']:,.0f}** tok/s per "
        f"drafter GPU (stages alone), pipeline efficiency **{p['efficiency']:.3f}** (measured steady state / "
        "min(stages alone)).",
        "",
        "| split T + D | T x capture | D x drafter | limited by | min x efficiency | launcher flags |",
        "|---|---|---|---|---|---|",
    ]
    for r in p["rows"]:
        is_best = (r["target_gpus"], r["drafter_gpus"]) == (
            p["best"]["target_gpus"],
            p["best"]["drafter_gpus"],
        )
        b = "**" if is_best else ""
        lines.append(
            f"| {b}{r['target_gpus']} + {r['drafter_gpus']}{b} | {r['target_tok_s']:,.0f} | "
            f"{r['drafter_tok_s']:,.0f} | {r['limited_by']} | {b}{r['projected_tok_s']:,.0f}{b} | "
            f"`{r['flags']}` |"
        )
    verdict = "met" if p["goal_met"] else "missed"
    lines += [
        "",
        f"Best split: **{p['best']['target_gpus']} + {p['best']['drafter_gpus']}**, "
        f"{p['best_projected_tok_s']:,.0f} tok/s projected: goal >= {p['goal_tok_s']:,} {verdict}. "
        f"Launcher: `python -m trainer.pipeline {p['best_flags']} ...` (the other flags unchanged).",
    ]
    return "\n".join(lines) + "\n"


def from_results(res: dict) -> list[tuple[str, dict]]:
    """The projections a bench_seeds.py results.json holds (``projection``, ``projection8``)."""
    return [
        (k, res[k])
        for k in ("projection", "projection8")
        if isinstance(res.get(k), dict) and "rows" in res[k]
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a bench_seeds.py results.json")
    a = ap.parse_args(argv)
    with open(a.results) as f:
        res = json.load(f)
    got = from_results(res)
    if not got:
        print("no projection in " + a.results + " (no stage rates measured?)", file=sys.stderr)
        return 1
    for k, p in got:
        print(markdown(p, p.get("source", k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
