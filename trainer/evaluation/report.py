"""Summaries of an evaluation: acceptance statistics over all verify steps, speed, and the text report.

- ``mean_accept_len``: mean over verify steps of (accepted drafts + 1), over every prompt together;
- ``per_position[k - 1]`` (k = 1 .. block_size - 1): the fraction of verify steps whose drafted position k was
  accepted (with every position before it: acceptance is a prefix);
- ``histogram[n - 1]``: verify steps with acceptance length n = 1 .. block_size;
- ``spec_tok_s`` / ``target_tok_s``: new tokens over decode seconds (after the prefill), speculative and
  target alone, in the same run; ``speedup`` = their ratio, which the acceptance length bounds (a verify step
  costs at least one one-token forward and yields ``mean_accept_len`` tokens): ``speedup_warning`` says why
  when it reads higher (``speedup_warning``);
- ``rewind_forwards`` (hybrid linear-attention targets): the extra target forwards that rolled the
  linear-attention state back after a rejected draft (one per such verify step; included in the timing);
- ``mean_accept_len_se`` (``over_prompts``): the standard error of ``mean_accept_len`` with the *prompt* as
  the unit that varies (a prompt's verify steps are not independent: one loops and accepts whole blocks,
  another is hard throughout); ``prompt_accept_len`` / ``prompt_steps``: each prompt's own mean and verify
  steps, so that two drafters evaluated on the same prompts can be compared prompt by prompt.
"""

from __future__ import annotations

import math
import random

from trainer.evaluation import divergence


def summarize(accept_lens: list[int], block_size: int) -> dict:
    steps = len(accept_lens)
    hist = [0] * block_size
    for n in accept_lens:
        hist[min(max(n, 1), block_size) - 1] += 1
    per_pos = [
        sum(1 for n in accept_lens if n - 1 >= k) / steps if steps else 0.0 for k in range(1, block_size)
    ]
    return {
        "mean_accept_len": sum(accept_lens) / steps if steps else None,
        "per_position": per_pos,
        "histogram": hist,
        "verify_steps": steps,
    }


def speedup_warning(r: dict) -> str | None:
    """Why a ``speedup`` above ``mean_accept_len`` is not the drafter's (None when it is not above): the
    target alone took longer a token than speculative decoding a whole step (verify forward and drafter)."""
    speedup, accept = r.get("speedup"), r.get("mean_accept_len")
    if not speedup or not accept or speedup <= accept:
        return None
    token_ms, step_ms = 1000 / r["target_tok_s"], 1000 * accept / r["spec_tok_s"]
    if str(r.get("device", "cpu")).startswith("cuda"):
        cause = (
            "the GPU busy with other work while the baseline ran, or a baseline warm-up that did not cover it"
        )
    else:
        cause = (
            f"on a CPU, threads contending with other processes ({r.get('threads')} thread(s) on "
            f"{r.get('cpu_count')} cores, load average {r.get('load_average')}): rerun on an idle machine, "
            "--threads at most its free cores"
        )
    return (
        f"speedup {speedup:.2f}x is above the acceptance length {accept:.2f}, which bounds it: the target alone "
        f"took {token_ms:.1f} ms a token, longer than a whole speculative step ({step_ms:.1f} ms); the baseline's "
        f"time is inflated, not the drafter faster. Likely cause: {cause}"
    )


def over_prompts(per_prompt: list[list[int]]) -> dict:
    """The spread of the pooled mean over prompts. ``mean_accept_len`` is a ratio of sums, R = sum(T_i) /
    sum(S_i) (prompt i: T_i tokens accepted + bonus over S_i verify steps); its standard error by the usual
    linearisation, sqrt(n / (n - 1) * sum((T_i - R S_i)^2)) / sum(S_i): ``None`` with fewer than 2 prompts
    that took a step."""
    return _spread([sum(x) for x in per_prompt], [len(x) for x in per_prompt])


def _spread(tokens: list[float], steps: list[int]) -> dict:
    n, total = sum(1 for s in steps if s), sum(steps)
    se = None
    if n >= 2:
        r = sum(tokens) / total
        se = (
            math.sqrt(n / (n - 1) * sum((t - r * s) ** 2 for t, s in zip(tokens, steps, strict=True))) / total
        )
    return {
        "mean_accept_len_se": se,
        "prompt_accept_len": [t / s if s else None for t, s in zip(tokens, steps, strict=True)],
        "prompt_steps": steps,
    }


def prompt_tokens(report: dict) -> list[float]:
    """Each prompt's accepted tokens (with the bonus) over its verify steps, from a report's per-prompt means."""
    return [
        m * n if n else 0.0 for m, n in zip(report["prompt_accept_len"], report["prompt_steps"], strict=True)
    ]


def pool(reports: list[dict]) -> dict:
    """Evaluations of one drafter on disjoint prompt sets (shards run side by side) as the one evaluation of all
    their prompts: acceptance over all their verify steps (from the histograms), the spread over all prompts
    (in shard order), token counts summed; ``spec_tok_s`` / ``target_tok_s`` = all tokens over all decode
    seconds (each shard's speed under the others' load); ``seconds`` the longest shard's; ``shards`` their
    number. The shards must share the drafter, the target and the settings."""
    if not reports:
        raise ValueError("no evaluations to pool")
    for key in ("block_size", "drafter", "target", "temperature", "max_new_tokens"):
        if len({str(r.get(key)) for r in reports}) != 1:
            raise ValueError(f"the evaluations differ in {key}: not shards of one evaluation")
    lens = [n for r in reports for n, c in enumerate(r["histogram"], 1) for _ in range(c)]
    out = {**reports[0], **summarize(lens, reports[0]["block_size"])}
    out.update(
        _spread(
            [t for r in reports for t in prompt_tokens(r)], [s for r in reports for s in r["prompt_steps"]]
        )
    )
    for key in ("prompts", "new_tokens", "rewind_forwards", "greedy_mismatches"):
        vals = [r.get(key) for r in reports]
        out[key] = None if None in vals else sum(vals)
    if out["greedy_mismatches"] is not None:
        out["greedy_match"] = out["greedy_mismatches"] == 0
    _pool_divergences(out, reports)
    for key in ("spec_tok_s", "target_tok_s"):  # decode seconds = tokens / speed, per shard
        rates = [r.get(key) for r in reports]
        secs = sum(r["new_tokens"] / v for r, v in zip(reports, rates, strict=True) if v) if all(rates) else 0
        out[key] = out["new_tokens"] / secs if secs else None
    out["speedup"] = (
        out["spec_tok_s"] / out["target_tok_s"] if out["spec_tok_s"] and out["target_tok_s"] else None
    )
    out["speedup_warning"] = speedup_warning(out)
    out["seconds"] = max(r["seconds"] for r in reports)
    out["shards"] = len(reports)
    return out


def _pool_divergences(out: dict, reports: list[dict]) -> None:
    """The shards' greedy divergences as one list (prompt indices shifted to the pooled order) and counts."""
    if any("greedy_divergences" not in r for r in reports):
        return
    found, first = [], 0
    for r in reports:
        found += [{**d, "prompt": d["prompt"] + first} for d in r["greedy_divergences"]]
        first += r["prompts"]
    out.update(divergence.summary(found))


def ci95(draws: list[float]) -> list[float]:
    """The 2.5th and 97.5th percentiles of bootstrap draws (sorted here)."""
    boot = sorted(draws)
    return [boot[int(0.025 * len(boot))], boot[min(len(boot) - 1, int(0.975 * len(boot)))]]


def paired_ratio(a: dict, b: dict, resamples: int = 10000, seed: int = 0) -> dict:
    """Drafter B against drafter A, both evaluated on the same prompts (two ``--json`` reports): the ratio of
    their mean acceptance lengths, and its 95% interval by a bootstrap that resamples *prompts*, each drawn
    prompt counted for both drafters (the comparison is paired: a prompt easy for one is easy for the other)."""
    pa, pb = a["prompt_steps"], b["prompt_steps"]
    if len(pa) != len(pb) or a.get("prompts") != b.get("prompts"):
        raise ValueError("the two evaluations did not decode the same prompts")
    ta, tb = prompt_tokens(a), prompt_tokens(b)

    def ratio(idx) -> float:
        sa, sb = sum(pa[i] for i in idx), sum(pb[i] for i in idx)
        return (sum(tb[i] for i in idx) / sb) / (sum(ta[i] for i in idx) / sa) if sa and sb else math.nan

    n, rng = len(pa), random.Random(seed)
    draws = (ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    boot = [x for x in draws if not math.isnan(x)]  # (a draw of prompts without a step: none to count)
    return {"ratio": ratio(range(n)), "ci95": ci95(boot), "prompts": n, "resamples": resamples}


def _ties(r: dict) -> str:
    """How many of the differing prompts left the target's output at a near tie (divergence.py)."""
    if r.get("greedy_mismatches_near_tie") is None:
        return ""
    worst = r.get("greedy_mismatch_max_rel_gap")
    return f"; {r['greedy_mismatches_near_tie']} at a near tie" + (
        f", largest gap {worst:.1e} of the top logit" if worst is not None else ""
    )


def format_report(r: dict) -> str:
    lines = [
        f"drafter {r['drafter']} (block {r['block_size']}) on {r['target']}",
        f"{r['prompts']} prompts x up to {r['max_new_tokens']} new tokens, temperature {r['temperature']:g}, "
        f"device {r['device']}" + (f", {r['threads']} thread(s)" if r.get("threads") else ""),
        f"mean acceptance length: {r['mean_accept_len']:.3f}"
        + (f" +- {r['mean_accept_len_se']:.3f}" if r.get("mean_accept_len_se") is not None else "")
        + f" tokens per verify step ({r['verify_steps']} steps, {r['new_tokens']} new tokens"
        + (", +- one standard error over prompts)" if r.get("mean_accept_len_se") is not None else ")"),
        "per position k=1..: " + " ".join(f"{x:.2f}" for x in r["per_position"]),
        "histogram (length 1..): " + " ".join(str(x) for x in r["histogram"]),
        f"decode: speculative {r['spec_tok_s']:.1f} tok/s, target alone {r['target_tok_s']:.1f} tok/s, "
        f"speedup {r['speedup']:.2f}x",
    ]
    if r.get("speedup_warning"):
        lines.append(f"warning: {r['speedup_warning']}")
    if r.get("rewind_forwards"):
        lines.append(
            f"linear-attention roll-back: {r['rewind_forwards']} extra target forwards "
            f"({r['rewind_forwards'] / max(1, r['verify_steps']):.2f} per verify step, in the timing)"
        )
    if r.get("greedy_match") is not None:
        lines.append(
            "greedy output equals the target's alone: "
            + (
                "yes, every prompt"
                if r["greedy_match"]
                else f"NO ({r['greedy_mismatches']} prompt(s) differ" + _ties(r) + ")"
            )
        )
    lines.append(f"took {r['seconds']:.1f} s")
    return "\n".join(lines)
