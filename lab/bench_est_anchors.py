"""The cost of ``--est-anchors`` (measuring blocks): one drafter micro-step (``DrafterRole.micro_step``: anchors,
drafter forward, DFlash loss, backward) with M = 0 and with M measuring anchors, on a CPU.

    PYTHONPATH=. python lab/bench_est_anchors.py                     # T 4096, 256 anchors, block 8, M 0 / 32
    PYTHONPATH=. python lab/bench_est_anchors.py --est 0,16,32,64 --reps 5

A random-weight Qwen3-shaped target config (hidden 64, 4 layers) and a 1-layer drafter; random hidden states
stand in for the target's (the step's cost does not depend on their values). Prints the median seconds per
micro-step for each M and the overhead against M = 0, beside the block ratio M / max_anchors that the flag's
help text quotes. SDPA with a dense mask (the CPU path): its attention cost grows with (A + M) * (T + A + M),
so at this size the overhead is a little above the block ratio; on CUDA (FlexAttention, block-sparse) the
context's projections dominate less and the ratio is the guide.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from trainer.drafting.config import DraftConfig
from trainer.drafting.head import FrozenHead
from trainer.model import DFlashDrafter
from trainer.run.rundir import RoleMeter
from trainer.runtime.hidden_queue import HiddenBatch
from trainer.runtime.roles import DrafterRole


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--max-anchors", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--est", default="0,32", help="comma-separated M values (0 first: the reference)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import Qwen3Config

    tc = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                     tie_word_embeddings=False)  # fmt: skip
    cfg = DraftConfig.from_target_config(tc, num_draft_layers=1, block_size=a.block_size)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).train()
    head = FrozenHead(torch.nn.Embedding(512, 64), torch.nn.Identity(), torch.nn.Linear(64, 512, bias=False))
    head.requires_grad_(False)
    T = a.tokens
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 511, (1, T), generator=g)
    docs = (torch.arange(T) // 512).unsqueeze(0)  # packed sequences of 512
    lm = torch.ones(1, T, dtype=torch.bool)
    hidden = torch.randn(1, T, cfg.num_captured * 64, generator=g)
    hb = HiddenBatch(0, 0, T, hidden, None, ids, lm, docs)
    out = {"tokens": T, "max_anchors": a.max_anchors, "block_size": a.block_size, "threads": a.threads,
           "command": " ".join(sys.argv), "median_s": {}}  # fmt: skip
    for M in [int(x) for x in a.est.split(",")]:
        role = DrafterRole(drafter, head, None, device="cpu", block_size=a.block_size, max_anchors=a.max_anchors,
                           gamma=7.0, noise_type="uniform", grad_clip=1.0, generator=torch.Generator(),
                           meter=RoleMeter("cpu", "drafter"), est_anchors=M)  # fmt: skip
        times = []
        for r in range(a.reps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            role.micro_step(hb, 0.0, 1.0, seed=r)
            times.append(time.perf_counter() - t0)
            drafter.zero_grad(set_to_none=True)
        out["median_s"][M] = statistics.median(times[1:])
    base = out["median_s"].get(0)
    for M, s in out["median_s"].items():
        extra = f" overhead {s / base - 1:+.1%} (blocks +{M / a.max_anchors:.1%})" if base and M else ""
        print(f"M={M}: {s * 1000:.1f} ms per micro-step{extra}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
