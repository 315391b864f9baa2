"""Run by the serve venv's python (.venv-serve: `make serve-venv`), never imported by the suite: real vLLM's
offline engine generates greedily for the token-id prompts of a JSON request, and prints one JSON line with
the outputs and, with a drafter, vLLM's own speculative-decoding counters (``LLM.get_metrics()``: the same
``vllm:spec_decode_*`` series its server exposes on ``/metrics``).

    python vllm_generate.py REQUEST.json

REQUEST: ``{"target": DIR, "drafter": DIR | null, "k": 7, "prompts": [[ids...], ...], "max_tokens": N}``.
Output: ``{"outputs": [[ids...], ...], "metrics": {name: value or [values]}}``.
"""

from __future__ import annotations

import json
import sys

SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")  # fmt: skip


def _engine(req: dict):
    from vllm import LLM

    kw = {}
    if req.get("drafter"):
        kw["speculative_config"] = {
            "method": "dflash",
            "model": req["drafter"],
            "num_speculative_tokens": req["k"],
        }
    # fp32 as trainer.evaluate on the CPU; eager (no compile: seconds, not minutes, on a small CPU)
    return LLM(model=req["target"], dtype="float32", enforce_eager=True, seed=0, max_model_len=1024,
               gpu_memory_utilization=0.05, kv_cache_memory_bytes=1 << 28, disable_log_stats=False, **kw)  # fmt: skip


def _metrics(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if m.name in SPEC:
            values = getattr(m, "values", None)
            out[m.name] = list(values) if values is not None else m.value
    return out


def main() -> int:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = _engine(req)
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": _metrics(llm)}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
