"""The data report: ``python -m trainer.prepare --report DATA_DIR`` (docs/trainer.md).

What the trainer will see of a prepared data directory: sequences, tokens, trained tokens, truncations and
drops at ``--max-seq-len`` (``dataset.load_dir``, the trainer's own loader), the length histogram as text
bars, the share of the tokenizer's unknown token (the ``"unk"`` counts prepare writes), the loss mask's
coverage per role (the ``roles`` runs ``trainer.prepare`` writes beside each sequence), and the packing efficiency at ``--token-budget`` / ``--max-batch-size`` (``dataset.Plan``, the
trainer's own packing, epoch 0 at ``--seed``). ``--json``: the same as one JSON object.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from trainer.data.dataset import DataError, Plan, data_files, load_dir, parse_line
from trainer.data.unknown_tokens import UNK_LIMIT

# the trainer's defaults (docs/trainer.md "Flags"); data is below run in the layers, so they are repeated here
TOKEN_BUDGET, MAX_SEQ_LEN, MAX_BATCH_SIZE = 16384, 4096, 64
BINS, BAR = 12, 40


def add_report_flags(p) -> None:
    p.add_argument("--report", metavar="DATA_DIR", default=None, help="report on prepared data instead")
    p.add_argument("--token-budget", type=int, default=TOKEN_BUDGET, help="report: the trainer's flag")
    p.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE, help="report: the trainer's flag")
    p.add_argument("--seed", type=int, default=0, help="report: the trainer's flag (packing order)")
    p.add_argument("--json", action="store_true", help="report: one JSON object")


def role_coverage(data_dir: str, unknown: dict | None = None) -> dict:
    """Tokens and trained tokens per role over the prepared sequences (as written, before truncation);
    ``unknown`` (a dict) gets ``tokens``, ``unk`` (the ``"unk"`` counts prepare writes) and ``unrecorded``
    (sequences without one: a tokenizer without an unknown token, or an older prepare)."""
    acc: dict[str, list[int]] = {}
    unk = {"tokens": 0, "unk": 0, "unrecorded": 0}
    for path in data_files(data_dir):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parsed = parse_line(path, lineno, line)
                if parsed is None:
                    continue
                rec = json.loads(line)
                _count_unk(unk, rec, len(parsed[0]))
                roles = rec.get("roles") or [["unknown", len(parsed[0])]]
                if sum(n for _, n in roles) != len(parsed[0]):
                    raise DataError(f'{path}:{lineno}: "roles" does not cover the {len(parsed[0])} tokens')
                pos = 0
                for role, n in roles:
                    a = acc.setdefault(role, [0, 0])
                    a[0] += n
                    a[1] += sum(parsed[1][pos : pos + n])
                    pos += n
    if unknown is not None:
        unknown.update(
            unk, share=unk["unk"] / unk["tokens"] if unk["tokens"] and not unk["unrecorded"] else None
        )
    return {
        r: {"tokens": t, "trained": k, "coverage": k / t if t else 0.0} for r, (t, k) in sorted(acc.items())
    }


def _count_unk(acc: dict, rec: dict, n_tokens: int) -> None:
    n = rec.get("unk")
    acc["tokens"] += n_tokens
    if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= n_tokens:
        acc["unk"] += n
    else:
        acc["unrecorded"] += 1


def packing(ds, token_budget: int, max_batch_size: int, seed: int) -> dict:
    plan = Plan(ds, seed=seed, epochs=1, token_budget=token_budget, max_batch_size=max_batch_size)
    n = plan.total
    tokens = int(ds.lengths.sum())
    return {
        "token_budget": token_budget,
        "max_batch_size": max_batch_size,
        "micro_batches": n,
        "efficiency": tokens / (n * token_budget),
        "sequences_per_micro_batch": len(ds) / n,
    }


def histogram(lengths: np.ndarray, bins: int = BINS) -> list[dict]:
    """Equal-width bins of whole lengths: ``lo``..``hi`` inclusive, none overlapping."""
    lo, hi = int(lengths.min()), int(lengths.max())
    edges = np.unique(np.linspace(lo, hi + 1, bins + 1).round().astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges)
    return [{"lo": int(edges[i]), "hi": int(edges[i + 1]) - 1, "count": int(c)} for i, c in enumerate(counts)]


def build_report(
    data_dir: str, *, max_seq_len: int, token_budget: int, max_batch_size: int, seed: int
) -> dict:
    ds = load_dir(data_dir, max_seq_len)
    lengths = ds.lengths
    unknown: dict = {}
    roles = role_coverage(data_dir, unknown)
    q = {f"p{p}": int(np.percentile(lengths, p)) for p in (50, 90, 99)}
    return {
        "data_dir": data_dir,
        "files": len(ds.files),
        "sequences": len(ds),
        "tokens": int(lengths.sum()),
        "trained_tokens": int(ds.mask.sum()),
        "max_seq_len": max_seq_len,
        "truncated": ds.truncated,
        "dropped": ds.dropped,
        "length": {"min": int(lengths.min()), "mean": float(lengths.mean()), **q, "max": int(lengths.max())},
        "histogram": histogram(lengths),
        "roles": roles,
        "unknown_tokens": unknown,
        "packing": packing(ds, token_budget, max_batch_size, seed),
    }


def format_report(r: dict) -> str:
    ln, pk = r["length"], r["packing"]
    top = max(b["count"] for b in r["histogram"]) or 1
    lines = [
        f"data {r['data_dir']}: {r['files']} file(s), {r['sequences']:,} sequences",
        f"tokens {r['tokens']:,}, trained {r['trained_tokens']:,} ({r['trained_tokens'] / r['tokens']:.1%})",
        f"at --max-seq-len {r['max_seq_len']}: {r['truncated']:,} truncated, {r['dropped']:,} dropped "
        "(no trained token)",
        f"length: min {ln['min']}, mean {ln['mean']:.1f}, p50 {ln['p50']}, p90 {ln['p90']}, p99 {ln['p99']}, "
        f"max {ln['max']}",
    ]
    for b in r["histogram"]:
        bar = "█" * round(BAR * b["count"] / top)
        lines.append(f"  {b['lo']:>7}-{b['hi']:<7} {bar} {b['count']:,}")
    lines.append(_unknown_line(r["unknown_tokens"]))
    lines.append("loss mask coverage by role (as prepared, before --max-seq-len):")
    for role, c in r["roles"].items():
        lines.append(
            f"  {role:<10} {c['trained']:>12,} of {c['tokens']:>12,} tokens trained ({c['coverage']:.1%})"
        )
    lines.append(
        f"packing at --token-budget {pk['token_budget']} --max-batch-size {pk['max_batch_size']}: "
        f"{pk['micro_batches']:,} micro-batches an epoch, {pk['sequences_per_micro_batch']:.1f} sequences each, "
        f"efficiency {pk['efficiency']:.1%} (tokens / micro-batches x budget)"
    )
    return "\n".join(lines)


def _unknown_line(u: dict) -> str:
    if u["share"] is None:
        return (
            f"unknown tokens: not recorded for {u['unrecorded']:,} sequence(s) (a tokenizer without an unknown "
            "token, or prepared by an older trainer.prepare)"
        )
    return f"unknown tokens: {u['unk']:,} of {u['tokens']:,} ({u['share']:.1%}; prepare refuses above {UNK_LIMIT:.0%})"


def report_main(a) -> int:
    max_seq_len = a.max_seq_len or MAX_SEQ_LEN
    bad = next(
        (
            f"{f}: must be >= 1, got {v}"
            for f, v in (
                ("--token-budget", a.token_budget),
                ("--max-seq-len", max_seq_len),
                ("--max-batch-size", a.max_batch_size),
            )
            if v < 1
        ),
        None,
    )
    if bad is None and max_seq_len > a.token_budget:
        bad = (
            f"--max-seq-len: {max_seq_len} is above --token-budget {a.token_budget} (the trainer refuses it)"
        )
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    try:
        r = build_report(
            a.report,
            max_seq_len=max_seq_len,
            token_budget=a.token_budget,
            max_batch_size=a.max_batch_size,
            seed=a.seed,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r) if a.json else format_report(r), flush=True)
    return 0
