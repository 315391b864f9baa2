"""Run by the serve venv's python (.venv-serve: `make serve-venv`), never imported by the suite: real vLLM's
offline engine generates greedily for the token-id prompts of a JSON request, and prints one JSON line with
the outputs and, with a drafter, vLLM's own speculative-decoding counters (``LLM.get_metrics()``: the same
``vllm:spec_decode_*`` series its server exposes on ``/metrics``).

    python vllm_generate.py REQUEST.json

REQUEST: ``{"target": DIR, "k": 7, "dtype": "float32", "prompts": [[ids...], ...], "max_tokens": N,
"engines": [{"drafter": DIR | null, "prefix_caching": bool (default vLLM's), "expect_error": bool}, ...],
"one_by_one": false}``: one engine after the other in this one process (vLLM imported once); an engine that
``expect_error`` and fails reports ``{"error": ...}`` (its cause is in the log), and is the last to run. ``one_by_one``: each prompt its own request, the next once it is done (as
``trainer.evaluate`` decodes), and the counters read after each (``per_prompt``).
Output: ``{"engines": [{"outputs": [[ids...], ...], "metrics": {name: value or [values]},
"per_prompt": [{"drafts": n, "accepted": n}, ...]}, ...]}``.
"""

from __future__ import annotations

import gc
import json
import sys

SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")  # fmt: skip


def _engine(req: dict, drafter: str | None, prefix_caching: bool | None):
    from vllm import LLM

    kw = {} if prefix_caching is None else {"enable_prefix_caching": prefix_caching}
    if drafter:
        kw["speculative_config"] = {"method": "dflash", "model": drafter, "num_speculative_tokens": req["k"]}
    # the dtype trainer.evaluate runs in; eager (no compile: seconds, not minutes, on a small CPU); text only
    # (a multimodal target's vision tower is never built)
    return LLM(model=req["target"], dtype=req.get("dtype", "float32"), enforce_eager=True, seed=0,
               max_model_len=1024, gpu_memory_utilization=0.05, kv_cache_memory_bytes=1 << 28,
               disable_log_stats=False, language_model_only=True, **kw)  # fmt: skip


def _metrics(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if m.name in SPEC:
            values = getattr(m, "values", None)
            out[m.name] = list(values) if values is not None else m.value
    return out


def _run(req: dict, engine: dict) -> dict:
    if not engine.get("expect_error"):
        return _generate(req, engine)
    try:
        return _generate(req, engine)
    except Exception as e:  # noqa: BLE001 - reported, the caller judges it
        return {"error": f"{type(e).__name__}: {e}"}


def _generate(req: dict, engine: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = _engine(req, engine.get("drafter"), engine.get("prefix_caching"))
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    batches = [[p] for p in prompts] if req.get("one_by_one") else [prompts]
    outputs, per_prompt, before = [], [], {"drafts": 0, "accepted": 0}
    for batch in batches:
        outputs += [list(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False)]
        m = _metrics(llm)
        now = {"drafts": m.get(SPEC[0], 0), "accepted": m.get(SPEC[1], 0)}
        per_prompt.append({key: now[key] - before[key] for key in now})
        before = now
    result = {"outputs": outputs, "metrics": _metrics(llm), "per_prompt": per_prompt}
    llm.llm_engine.engine_core.shutdown()  # the engine core process ends before the next engine starts
    del llm
    gc.collect()
    return result


def main() -> int:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    engines = req.get("engines") or [{"drafter": req.get("drafter")}]
    result = {"engines": [_run(req, e) for e in engines]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
