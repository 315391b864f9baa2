"""Shared builders for the drafter tests: a tiny random Qwen3 target and a drafter on it (no download)."""

from __future__ import annotations

import torch

from trainer.drafting.config import DraftConfig
from trainer.drafting.head import FrozenHead
from trainer.model import DFlashDrafter

VOCAB = 300


def tiny_target_config(**over):
    from transformers import Qwen3Config

    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    kw.update(over)
    return Qwen3Config(**kw)


def tiny_target(seed: int = 0, **over):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_target_config(**over)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg).eval()


def tiny_drafter(seed: int = 1, target_config=None, **over) -> tuple[DFlashDrafter, DraftConfig]:
    kw = dict(num_draft_layers=2, block_size=4)
    kw.update(over)
    cfg = DraftConfig.from_target_config(target_config or tiny_target_config(), **kw)
    torch.manual_seed(seed)
    return DFlashDrafter(cfg).eval(), cfg


def random_embed(seed: int = 2, vocab: int = VOCAB, hidden: int = 64) -> torch.nn.Embedding:
    torch.manual_seed(seed)
    e = torch.nn.Embedding(vocab, hidden)
    e.requires_grad_(False)
    return e


def frozen_head_of(model) -> FrozenHead:
    return FrozenHead.from_model(model)


def tiny_prompts(tiny_assets, n: int) -> list[list[int]]:
    """The first ``n`` prompts of the tiny data set: each line's tokens up to its first trained token."""
    import json

    prompts = []
    with open(tiny_assets / "data" / "train.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            prompts.append(rec["input_ids"][: rec["loss_mask"].index(1)])
            if len(prompts) == n:
                break
    return prompts


def cpu_drafter_role(drafter, head, *, block_size: int, max_anchors: int, gamma: float, **kw):
    """A DrafterRole on the CPU with no optimizer, a fresh generator and meter (``kw``: any other argument,
    e.g. ``noise_type`` (default gaussian), ``grad_clip`` (1.0), ``est_anchors``)."""
    from trainer.run.rundir import RoleMeter
    from trainer.runtime.roles import DrafterRole

    kw.setdefault("noise_type", "gaussian")
    kw.setdefault("grad_clip", 1.0)
    return DrafterRole(
        drafter,
        head,
        None,
        device="cpu",
        block_size=block_size,
        max_anchors=max_anchors,
        gamma=gamma,
        generator=torch.Generator(),
        meter=RoleMeter("cpu", "drafter"),
        **kw,
    )


def saved_random_drafter(target_dir, out, num_draft_layers: int = 1, block_size: int = 4, seed: int = 0):
    """A random (untrained) drafter for the target at ``target_dir``, saved as the trainer saves one, in ``out``."""
    from transformers import AutoConfig

    from trainer.model import save_drafter

    cfg = DraftConfig.from_target_config(
        AutoConfig.from_pretrained(target_dir), num_draft_layers=num_draft_layers, block_size=block_size
    )
    torch.manual_seed(seed)
    save_drafter(DFlashDrafter(cfg), cfg, out)
    return out
