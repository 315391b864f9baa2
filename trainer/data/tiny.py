"""``python -m trainer.tiny OUT``: a tiny random Qwen3 target, its tokenizer and a learnable data set.

Writes, with no network access:
- ``OUT/target/``: a 6-layer, 64-wide Qwen3 (random weights, safetensors) and a word-level tokenizer
  (``tokenizers`` library wrapped in PreTrainedTokenizerFast) with a chat template; both load with
  ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(OUT/target)``. The last vocab id is
  ``<|mask|>``, the drafter's default mask token.
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


def build(out: str, *, n_docs: int = 400, seed: int = 0) -> dict[str, str]:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.data.prepare import prepare

    target = os.path.join(out, "target")
    raw = os.path.join(out, "raw")
    data = os.path.join(out, "data")
    for d in (target, raw, data):
        os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config())
    with torch.no_grad():  # a trained model's scale: token identity and logits visible in one step
        model.get_input_embeddings().weight.normal_(0.0, EMBED_STD)
        model.get_output_embeddings().weight.normal_(0.0, LM_HEAD_STD)
    model.save_pretrained(target)
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
    a = p.parse_args(argv)
    paths = build(a.out, n_docs=a.docs, seed=a.seed)
    print(json.dumps(paths), flush=True)
    return 0
