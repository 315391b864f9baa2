"""``python -m trainer.tiny OUT``: a tiny random target, its tokenizer and a learnable data set.

Writes, with no network access:
- ``OUT/target/``: a 6-layer, 64-wide Qwen3 (random weights, safetensors) and a word-level tokenizer
  (``tokenizers`` library wrapped in PreTrainedTokenizerFast) with a chat template; both load with
  ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(OUT/target)``. The last vocab id is
  ``<|mask|>``, the drafter's default mask token.
  ``--target qwen3_5`` / ``qwen3_5_moe``: instead a tiny hybrid linear-attention target in the layout of
  the Qwen3.5/3.6 checkpoints (``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration``:
  8 text layers = 2 x (3 Gated DeltaNet + 1 gated attention) under ``model.language_model.*``, a one-block
  vision tower under ``model.visual.*`` and a few ``mtp.*`` tensors standing for the MTP head).
- ``OUT/raw/chat.jsonl``: chat examples (input for ``python -m trainer.prepare``).
- ``OUT/data/train.jsonl``: the same examples tokenized (the trainer's format, docs/trainer.md).

The tasks are predictable continuations (counting by a stride, repeating a motif), so a drafter's
acceptance length rises within minutes of CPU training even though the target itself is random.
"""

from __future__ import annotations

import argparse
import json
import os
import random

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
WORDS = ["system", "user", "assistant", "count", "from", "by", "repeat", "please", "ok"]
NUMBERS = [str(i) for i in range(100)]
VOCAB_SIZE = 128
MASK = "<|mask|>"
EMBED_STD = 1.0  # transformers' 0.02 init makes logits of a frozen random lm_head too flat to learn against
LM_HEAD_STD = 0.25
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocab() -> dict[str, int]:
    words = SPECIALS + WORDS + NUMBERS
    fillers = [f"w{i}" for i in range(VOCAB_SIZE - 1 - len(words))]
    return {w: i for i, w in enumerate(words + fillers + [MASK])}


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="[UNK]",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        mask_token=MASK,
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def target_config():
    from transformers import Qwen3Config

    v = vocab()
    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        eos_token_id=v["<|im_end|>"],
        bos_token_id=None,
        pad_token_id=None,
    )


HYBRID_TARGETS = ("qwen3_5", "qwen3_5_moe")
TARGETS = ("qwen3", *HYBRID_TARGETS)


def hybrid_text_config(moe: bool = False) -> dict:
    """The text part of a tiny Qwen3.5 / Qwen3.5-MoE (the Qwen3.6-27B layout scaled down: partial rotary
    0.25 with interleaved mrope sections, output gate, GDN with more value than key heads, conv width 4)."""
    v = vocab()
    d = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [2, 1, 1],
        },
        "tie_word_embeddings": False,
        "eos_token_id": v["<|im_end|>"],
    }
    if moe:
        d.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    return d


def hybrid_config(moe: bool = False, **text: object):
    """A tiny multimodal Qwen3.5 config (text + a one-block vision tower); ``text`` overrides text fields."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 16,
    }
    ids = {
        "image_token_id": 120,
        "video_token_id": 121,
        "vision_start_token_id": 122,
        "vision_end_token_id": 123,
    }
    return cls(
        text_config={**hybrid_text_config(moe), **text},
        vision_config=vision,
        tie_word_embeddings=False,
        **ids,
    )


def _add_mtp(target: str, seed: int) -> None:
    """Add ``mtp.*`` tensors (what a real checkpoint's one-layer MTP head holds, in miniature)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(target, "model.safetensors")
    tensors = load_file(path)
    g = torch.Generator().manual_seed(seed + 7)
    for name, shape in (
        ("mtp.fc.weight", (64, 128)),
        ("mtp.pre_fc_norm_embedding.weight", (64,)),
        ("mtp.layers.0.mlp.up_proj.weight", (128, 64)),
        ("mtp.norm.weight", (64,)),
    ):
        tensors[name] = torch.randn(shape, generator=g)
    save_file(tensors, path, metadata={"format": "pt"})


def build_target(target: str, kind: str = "qwen3", seed: int = 0, **text: object) -> None:
    """Write the random target model (safetensors + config.json) of ``kind`` into ``target``; ``text``
    overrides a hybrid target's text config fields (e.g. head sizes a server's kernels take)."""
    import torch
    from transformers import AutoModelForCausalLM

    if kind not in TARGETS:
        raise ValueError(f"unknown tiny target {kind!r}: one of {TARGETS}")
    torch.manual_seed(seed)
    if kind == "qwen3":
        model = AutoModelForCausalLM.from_config(target_config())
    else:
        from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration

        cls = Qwen3_5MoeForConditionalGeneration if kind == "qwen3_5_moe" else Qwen3_5ForConditionalGeneration
        model = cls(hybrid_config(moe=kind == "qwen3_5_moe", **text))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") and "visual" not in name:  # zero-centred: 0 = 1x; spread
                    p.normal_(0.0, 0.1)
                elif name.endswith("linear_attn.A_log"):  # slow decay: a long memory, as trained models have
                    p.copy_(torch.empty_like(p).uniform_(0.005, 0.1).log())
                elif ".linear_attn." in name and name.endswith("proj.weight"):  # mixers at a trained scale
                    p.normal_(0.0, 0.15)
    with torch.no_grad():  # a trained model's scale: token identity and logits visible in one step
        model.get_input_embeddings().weight.normal_(0.0, EMBED_STD)
        model.get_output_embeddings().weight.normal_(0.0, LM_HEAD_STD)
    model.save_pretrained(target)
    if kind != "qwen3":
        _add_mtp(target, seed)


def conversations(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(24, 64)
        if rng.random() < 0.5:
            a, d = rng.randrange(100), rng.randint(1, 2)
            ask = f"count from {a} by {d}"
            ans = [str((a + d * k) % 100) for k in range(length)]
        else:
            motif = [str(rng.randrange(100)) for _ in range(rng.randint(2, 4))]
            ask = "repeat " + " ".join(motif)
            ans = [motif[k % len(motif)] for k in range(length)]
        out.append(
            {"messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": " ".join(ans)}]}
        )
    return out


def build(out: str, *, n_docs: int = 400, seed: int = 0, target_kind: str = "qwen3") -> dict[str, str]:
    from trainer.data.tokenizing import prepare

    target = os.path.join(out, "target")
    raw = os.path.join(out, "raw")
    data = os.path.join(out, "data")
    for d in (target, raw, data):
        os.makedirs(d, exist_ok=True)
    build_target(target, target_kind, seed)
    tok = build_tokenizer()
    tok.save_pretrained(target)
    chat = os.path.join(raw, "chat.jsonl")
    with open(chat, "w", encoding="utf-8") as f:
        for conv in conversations(n_docs, seed):
            f.write(json.dumps(conv) + "\n")
    prepare(tok, [chat], data, shard_size=10**9)
    os.replace(os.path.join(data, "part-00000.jsonl"), os.path.join(data, "train.jsonl"))
    return {"target": target, "data": data, "raw": chat}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer.tiny", description="Write a tiny target and data set."
    )
    p.add_argument("out", help="output directory (target/, data/, raw/ are created in it)")
    p.add_argument("--docs", type=int, default=400, help="number of training sequences")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="qwen3",
        help="qwen3: a dense Qwen3 (default); qwen3_5 / qwen3_5_moe: a hybrid linear-attention target in "
        "the multimodal Qwen3.5/3.6 checkpoint layout (vision tower and MTP tensors beside the text model)",
    )
    a = p.parse_args(argv)
    paths = build(a.out, n_docs=a.docs, seed=a.seed, target_kind=a.target)
    print(json.dumps(paths), flush=True)
    return 0
