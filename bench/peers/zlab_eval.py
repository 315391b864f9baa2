"""Run in the z-lab venv (``dflash==0.1.0``): z-lab's own decoding loop, ``dflash.model.dflash_generate``, greedy,
on the bench's held-out prompts (the first ``--prompt-len`` ids of the first ``--num-prompts`` rows of a JSONL of
``input_ids``, as ``trainer.evaluate`` reads them), for one drafter in z-lab's layout. Prints one JSON object
in ``trainer.evaluate --json``'s per-prompt terms (``prompt_accept_len``, ``prompt_steps``, ``mean_accept_len``)
so the bench pairs the two evaluators' figures alike. Each verify step's length is z-lab's ``produced``
(accepted drafts + the bonus token). Run-time patch on a CPU: ``dflash.model._cuda_time`` (it calls
``torch.cuda.synchronize``) -> ``time.perf_counter``."""

import argparse
import json
import time

import dflash.model as zm
import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if not a.device.startswith("cuda"):
        zm._cuda_time = time.perf_counter
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=dtype).to(a.device).eval()
    with open(f"{a.drafter}/config.json") as f:
        arch = json.load(f).get("architectures", ["DFlashDraftModel"])[0]
    cls = zm.DFlash2DraftModel if arch == "DFlash2DraftModel" else zm.DFlashDraftModel
    draft = cls.from_pretrained(a.drafter, dtype=dtype).to(a.device).eval()
    with open(a.prompts) as f:
        rows = [json.loads(x)["input_ids"][: a.prompt_len] for x in f if x.strip()][: a.num_prompts]
    means, steps, lens, tokens, secs = [], [], [], 0, 0.0
    for ids in rows:
        x = torch.tensor([ids], device=a.device)
        t0 = time.perf_counter()
        r = zm.dflash_generate(draft, target, x, a.max_new_tokens, None, temperature=0.0, return_stats=True)
        secs += time.perf_counter() - t0
        acc = [int(v) for v in r.acceptance_lengths]
        lens += acc
        tokens += r.num_output_tokens
        steps.append(len(acc))
        means.append(sum(acc) / len(acc) if acc else 0.0)
    hist = [0] * draft.block_size
    for n in lens:
        hist[min(max(n, 1), draft.block_size) - 1] += 1
    print(json.dumps({"evaluator": "z-lab dflash_generate", "prompts": len(rows), "prompt_accept_len": means,
                      "prompt_steps": steps, "mean_accept_len": sum(lens) / len(lens), "verify_steps": len(lens),
                      "histogram": hist, "new_tokens": tokens, "spec_tok_s": tokens / secs, "seconds": secs,
                      "block_size": draft.block_size, "device": a.device}))  # fmt: skip


if __name__ == "__main__":
    main()
