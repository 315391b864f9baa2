"""The conformance pairs: a tiny dense Qwen3 that vLLM's CPU attention takes (head_dim 32: its kernels take
32..512, the suite's tiny target has 16), its own greedy text as training data (a drafter trained on the
target's outputs accepts well, so every draft position is exercised), and held-out prompts.

The dense target is ``trainer.data.tiny_build``'s, with 2 heads of 32 instead of 4 of 16, its projections
drawn wider, and its tokenizer. The hybrid one (``build_hybrid_target``) is tiny_build's Qwen3.5 (Gated
DeltaNet + gated attention, multimodal checkpoint layout) with Gated DeltaNet heads of 32 (vLLM's CPU kernel
takes value heads of multiples of 32; the suite's has 16); its attention heads are 32 already."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

PROMPT_LEN = 8  # every prompt as long: one batch, no padding
WEIGHT_STD = 0.05


def build_target(tiny_target: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.data import tiny_build

    cfg = tiny_build.target_config()
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 2, 1, 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # the projections at 0.05: greedy text falls into loops of many kinds, not one
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, WEIGHT_STD)
        model.get_input_embeddings().weight.normal_(0.0, tiny_build.EMBED_STD)
        model.get_output_embeddings().weight.normal_(0.0, tiny_build.LM_HEAD_STD)
    model.save_pretrained(out)
    _copy_tokenizer(tiny_target, out)


HYBRID_HEADS = {"linear_key_head_dim": 64, "linear_value_head_dim": 64}


def build_hybrid_target(tiny_target: Path, out: Path) -> None:
    from trainer.data import tiny_build

    tiny_build.build_target(str(out), "qwen3_5", 0, **HYBRID_HEADS)
    _copy_tokenizer(tiny_target, out)


def _copy_tokenizer(tiny_target: Path, out: Path) -> None:
    for f in tiny_target.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, out / f.name)


def prompts(data_dir: Path, n: int, skip: int = 0) -> list[list[int]]:
    """The first ``PROMPT_LEN`` tokens of ``n`` training lines of the tiny data set, from line ``skip``."""
    lines = (data_dir / "train.jsonl").read_text().splitlines()[skip : skip + n]
    return [json.loads(x)["input_ids"][:PROMPT_LEN] for x in lines]


def greedy_data(target: Path, ps: list[list[int]], new: int, out: Path) -> None:
    """The target's greedy continuations of ``ps``, as training lines (``loss_mask`` on the output)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = torch.tensor(ps)
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w") as f:
        for row in gen.tolist():
            f.write(json.dumps({"input_ids": row, "loss_mask": [0] * PROMPT_LEN + [1] * new}) + "\n")
