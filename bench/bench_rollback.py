"""Speculative decoding on a hybrid (Gated DeltaNet) target: roll-back by per-position states vs by replay.

    PYTHONPATH=. python bench/bench_rollback.py                       # CPU, fp32, one thread (~2 min)
    PYTHONPATH=. python bench/bench_rollback.py --device cuda:0 --out $OUT/bench_rollback.json   # bf16

``trainer.evaluation.spec_decode.CachedTarget`` rolls a hybrid target's linear-attention state back after a
partly accepted block either from the verify forward's own per-position states (``rewind="states"``, no
extra forward) or by restoring a snapshot and running the kept tokens again (``"replay"``: one extra target
forward per rejected block). This times both on random-weight Qwen3.5 text models (``Qwen3_5ForCausalLM``,
2 x (3 Gated DeltaNet + 1 gated attention)):
- ``tiny``: the test target's text config (``trainer.data.tiny_build.hybrid_text_config``: hidden 64);
- ``small``: hidden 256, 8 layers (4 key / 8 value heads of 32, 4 q / 2 kv heads of 64, MLP 768, vocab 256);
- ``h384``: the issue's trained-target shape (hidden 384, 8 layers, MLP 1,152), random weights.

Fixed prompts (seeded random ids, ``--prompt-len``); the proposer is an oracle that drafts the target's own
greedy continuation, right on the first ``--right`` drafted positions of each block and wrong after them
(acceptance length ``right + 1``; proposing costs nothing, so the figures are the target's side of the
loop). Per shape: target-only tok/s (one token per forward), then per ``right`` and mode: speculative tok/s,
its speedup over target-only, extra forwards per verify step, and whether the output equals the target's
greedy output. Best of ``--repeats`` timed passes after one warm-up prompt. ``--profile``: also a profiler
table of target-only decode steps per shape (on CUDA with device times: where a decode step goes).

``--engines cache,static``: ``cache`` is ``CachedTarget`` (transformers' cache, both roll-back modes);
``static`` is ``static_target.StaticTarget`` (fixed buffers, per-position states, CUDA graphs on CUDA: the
evaluation's default on CUDA), target-only and speculative. ``--drafter-layers N`` (default 2; 0: none) makes
the oracle pay for a real drafter: every proposal also runs a random DFlash drafter of N layers of the
target's width on the accepted features (``DrafterProposer`` beside the cache engine, ``StaticProposer``
beside the static one) and waits for its tokens, so the speed-ups include the drafter's side of the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.evaluation.drafter_cache import DrafterProposer, Proposal  # noqa: E402
from trainer.evaluation.spec_decode import (  # noqa: E402
    REWIND_MODES,
    CachedTarget,
    speculative_generate,
    target_generate,
)
from trainer.evaluation.static_drafter import StaticProposer  # noqa: E402
from trainer.evaluation.static_target import StaticTarget  # noqa: E402

SHAPES = {
    "tiny": {},
    "small": dict(
        vocab_size=256, hidden_size=256, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
        linear_value_head_dim=32,
    ),
    "h384": dict(
        vocab_size=256, hidden_size=384, intermediate_size=1152, num_attention_heads=6, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=48,
        linear_value_head_dim=48,
    ),
}  # fmt: skip


class Oracle:
    """Drafts ``ref`` (prompt + the target's greedy continuation): right on the first ``right`` positions."""

    def __init__(self, ref: list[int], right: int, block_size: int, vocab: int, drafter=None):
        self.ref, self.right, self.block_size, self.vocab = ref, right, block_size, vocab
        self.drafter = drafter  # a real proposer whose work (not its tokens) each proposal pays for

    def reset(self) -> None:
        if self.drafter is not None:
            self.drafter.reset()

    def propose(self, tokens, new_features, temperature, generator):
        if self.drafter is not None:
            self.drafter.propose(tokens, new_features, 0.0, None).tokens.tolist()
        at = len(tokens)
        out = [
            self.ref[at + k] if k < self.right else (self.ref[at + k] + 1) % self.vocab
            for k in range(self.block_size - 1)
        ]
        return Proposal(torch.tensor(out))


def build_model(shape: str, device, dtype, seed: int = 0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from trainer.data.tiny_build import hybrid_text_config

    cfg = Qwen3_5TextConfig(**{**hybrid_text_config(), **SHAPES[shape], "eos_token_id": None})
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)
    return model


def random_drafter(model, block: int, layers: int):
    """A random DFlash drafter of ``layers`` layers on the target's width (its features: layers 1 and 3)."""
    from trainer.drafting.config import DraftConfig
    from trainer.model import DFlashDrafter

    cfg = DraftConfig.from_target_config(
        model.config, num_draft_layers=layers, block_size=block, target_layer_ids=[1, 3]
    )
    torch.manual_seed(2)
    p = next(model.parameters())
    return DFlashDrafter(cfg).to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)


def _target(engine: str, model, a):
    if engine == "static":
        max_len = a.prompt_len + a.new + 2 * a.block + 1
        return StaticTarget(model, [1, 3], max_len, graph_sizes=(1, a.block))
    return CachedTarget(model, [1, 3], rewind=engine)


def _proposer(engine: str, model, a):
    if not a.drafter_layers:
        return None
    d = random_drafter(model, a.block, a.drafter_layers)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if engine == "static":
        return StaticProposer(d, emb, head, a.prompt_len + a.new + 2 * a.block + 1)
    return DrafterProposer(d, emb, head)


def _timed(fn, prompts: list[list[int]], repeats: int) -> tuple[float, list]:
    """The best tok/s of ``fn(prompt)`` over all prompts in ``repeats`` passes (the machine may be shared:
    the fastest pass is the least disturbed); the last pass's generations."""
    rates, gens = [], []
    for _ in range(repeats):
        gens = [fn(p) for p in prompts]
        rates.append(sum(len(g.tokens) for g in gens) / sum(g.decode_s for g in gens))
    return max(rates), gens


def profile_decode(model, device, n: int = 20) -> None:
    """Where one target-only decode step goes: ops by self time over ``n`` steps (CPU and, on CUDA, device
    time), and the host time per step."""
    from torch.profiler import ProfilerActivity, profile

    t = CachedTarget(model, [1, 3])
    t.prefill(list(range(64)))
    for _ in range(5):
        t.forward_block([5], want_features=False)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            logits, _ = t.forward_block([5], want_features=False)
            int(logits[-1].argmax())  # the loop's per-token host sync
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / n
    print(f"aten ops per decode step (every level): {ops:.0f}")


def say(t0: float, text: str) -> None:
    """A progress line on stderr, with the seconds since the bench began (visible from its first second)."""
    print(f"[{time.monotonic() - t0:6.1f} s] {text}", file=sys.stderr, flush=True)


BASE_KEY = {"cache": "target_tok_s", "static": "target_tok_s_static"}


def _target_only(engine: str, model, a, prompts, t0: float) -> tuple[float, list]:
    t = CachedTarget(model, [1, 3]) if engine == "cache" else _target("static", model, a)
    graphs = engine == "static" and next(model.parameters()).is_cuda
    say(t0, f"{engine} target-only: warming up" + (", capturing CUDA graphs" if graphs else ""))
    target_generate(t, prompts[0], 8)
    rate, gens = _timed(lambda p: target_generate(t, p, a.new + a.block), prompts, a.repeats)
    say(t0, f"{engine} target-only: {rate:.1f} tok/s")
    return rate, gens


def bench_shape(shape: str, a, device, dtype, t0: float) -> dict:
    """Target-only decoding per engine (the first engine's greedy output is the oracle's reference; the
    cache engine's when it runs), then speculative decoding per oracle ``right`` and mode."""
    model = build_model(shape, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    say(t0, f"{shape}: {params / 1e6:.2f}M params on {device}")
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    row, refs = {"shape": shape, "params": params, "reference": a.engines[0]}, None
    for engine in a.engines:
        row[BASE_KEY[engine]], gens = _target_only(engine, model, a, prompts, t0)
        outs = [p + x.tokens for p, x in zip(prompts, gens, strict=True)]
        if refs is None:
            refs = outs
        else:
            row[f"{engine}_target_only_match"] = outs == refs
    for right in a.right:
        for mode in modes_of(a.engines):
            row[f"right{right}_{mode}"] = r = _spec_row(model, a, mode, right, prompts, refs, row)
            say(t0, f"accept {r['accept_len']:.2f} {mode}: {r['spec_tok_s']:.1f} tok/s ({r['speedup']:.2f}x)")
    return row


def modes_of(engines: list[str]) -> list[str]:
    return [m for e in engines for m in (REWIND_MODES if e == "cache" else (e,))]


def _spec_row(model, a, mode: str, right: int, prompts, refs, row) -> dict:
    vocab = model.config.vocab_size
    t, drafter = _target(mode, model, a), _proposer(mode, model, a)
    by_prompt = {
        tuple(p): Oracle(r, right, a.block, vocab, drafter) for p, r in zip(prompts, refs, strict=True)
    }
    speculative_generate(t, by_prompt[tuple(prompts[0])], prompts[0], 8)  # warm-up
    rate, gens = _timed(
        lambda p, t=t, o=by_prompt: speculative_generate(t, o[tuple(p)], p, a.new), prompts, a.repeats
    )
    steps = sum(len(x.accept_lens) for x in gens)
    base = row[BASE_KEY["static" if mode == "static" else "cache"]]
    return {
        "spec_tok_s": rate,
        "speedup": rate / base,
        "accept_len": sum(sum(x.accept_lens) for x in gens) / steps,
        "rewind_forwards_per_step": sum(x.rewind_forwards for x in gens) / steps,
        "greedy_match": all(
            x.tokens == r[len(p) : len(p) + a.new] for x, p, r in zip(gens, prompts, refs, strict=True)
        ),
    }


def print_row(row: dict, rights: list[int], modes: list[str]) -> None:
    rates = ", ".join(f"{e} {row[k]:.1f} tok/s" for e, k in BASE_KEY.items() if k in row)
    print(f"{row['shape']} ({row['params'] / 1e6:.2f}M params): target-only {rates}")
    for right in rights:
        for mode in modes:
            r = row[f"right{right}_{mode}"]
            print(
                f"  accept {r['accept_len']:.2f}  {mode:6s}  spec {r['spec_tok_s']:7.1f} tok/s  "
                f"speedup {r['speedup']:.2f}x  extra forwards/step {r['rewind_forwards_per_step']:.2f}  "
                f"greedy match {r['greedy_match']}"
            )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (fp32) or cuda:N (bf16)")
    p.add_argument("--shapes", default="tiny,small", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument(
        "--right", default="1,3", help="oracle: right drafted positions per block (comma-separated)"
    )
    p.add_argument("--block", type=int, default=8, help="block size (anchor + block - 1 drafts)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    p.add_argument("--profile", action="store_true", help="also profile target-only decode steps per shape")
    p.add_argument(
        "--engines",
        default="cache,static",
        help="comma-separated, of cache and static; the first one's greedy output is the reference "
        "(static alone: no pass through transformers' cache, which decodes ~30 tok/s on a GPU)",
    )
    p.add_argument("--drafter-layers", type=int, default=2, help="random drafter run per proposal (0: none)")
    a = p.parse_args(argv)
    a.engines = a.engines.split(",")
    if not a.engines or any(e not in ("cache", "static") for e in a.engines):
        p.error("--engines: comma-separated, of cache and static")
    a.right = [int(x) for x in a.right.split(",")]
    if any(not 0 <= r < a.block for r in a.right) or a.block < 2:
        p.error("--right: each in 0 .. block - 1, and --block >= 2")
    shapes = a.shapes.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        p.error(f"--shapes: unknown {unknown}")
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.monotonic()
    rows = []
    for shape in shapes:
        rows.append(bench_shape(shape, a, device, dtype, t0))
        print_row(rows[-1], a.right, modes_of(a.engines))
        if a.profile:
            profile_decode(build_model(shape, device, dtype), device)
    meta = {"device": str(device), "dtype": str(dtype), "torch": torch.__version__, "args": vars(a)}
    import transformers

    meta.update(transformers=transformers.__version__, seconds=time.monotonic() - t0)
    print(f"{meta['seconds']:.0f} s; {a.prompts} prompts x {a.new} new tokens, block {a.block}, {dtype}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
