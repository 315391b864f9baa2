"""``python -m trainer.prepare``: tokenize chat/completion JSONL into the trainer's data format.

    python -m trainer.prepare --tokenizer TARGET_DIR --input raw.jsonl [more.jsonl ...] --output-dir DATA_DIR

Input lines (one JSON object each), first matching form wins:
- ``{"messages": [{"role": ..., "content": ...}, ...]}`` (``"conversations"`` with ``from``/``value`` and
  human/gpt roles is accepted too): rendered with the tokenizer's chat template when it has one;
  the loss mask covers the assistant turns (content and end-of-turn tokens).
- ``{"prompt": str, "completion": str}``: text = prompt + completion; the loss mask covers the completion.
- ``{"text": str}``: every token is trained.
Output: ``DATA_DIR/part-00000.jsonl`` ... with ``{"input_ids": [...], "loss_mask": [...]}`` (docs/trainer.md).
``--heldout-fraction F`` sends about that fraction of the sequences to ``DATA_DIR/heldout/part-*.jsonl``
instead (the choice is a hash of the input line: the same lines whatever the order or the run), prompts for
``python -m trainer.evaluate`` and ``--eval-data`` that the drafter never trained on (the trainer reads only
``DATA_DIR/*.jsonl``, not the subdirectory).
A malformed input line stops the run with a message naming the file and line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


class PrepareError(ValueError):
    pass


def _messages(rec: dict) -> list[dict] | None:
    if "messages" in rec:
        msgs = rec["messages"]
        key_role, key_content = "role", "content"
    elif "conversations" in rec:
        msgs = rec["conversations"]
        key_role, key_content = "from", "value"
    else:
        return None
    if not isinstance(msgs, list) or not msgs:
        raise PrepareError("messages must be a non-empty list")
    out = []
    for m in msgs:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get(key_role), str)
            or not isinstance(m.get(key_content), str)
        ):
            raise PrepareError(f"each message needs string {key_role!r} and {key_content!r}")
        role = ROLE_ALIASES.get(m[key_role], m[key_role])
        out.append({"role": role, "content": m[key_content]})
    return out


def _render_plain(msgs: list[dict], add_generation_prompt: bool = False) -> str:
    text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
    return text + ("assistant: " if add_generation_prompt else "")


def _render(tok, msgs: list[dict], add_generation_prompt: bool = False) -> str:
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    return _render_plain(msgs, add_generation_prompt)


def chat_spans(tok, msgs: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    full = _render(tok, msgs)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        head = _render(tok, msgs[:i], add_generation_prompt=True)
        upto = _render(tok, msgs[: i + 1])
        if full.startswith(head) and full.startswith(upto) and len(upto) > len(head):
            start, end = len(head), len(upto)
        else:  # templates that rewrite earlier turns: find the content itself
            start = full.find(m["content"], cursor)
            if start < 0:
                raise PrepareError(f"cannot locate assistant turn {i} in the rendered conversation")
            end = start + len(m["content"])
        spans.append((start, end))
        cursor = end
    return full, spans


def tokenize_spans(tok, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask of the tokens that start inside one of ``spans``."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = []
    for a, b in enc["offset_mapping"]:
        inside = any(s <= a < e or (a == b and s < a <= e) for s, e in spans)
        mask.append(1 if inside else 0)
    return ids, mask


def encode_record(tok, rec) -> tuple[list[int], list[int]]:
    if not isinstance(rec, dict):
        raise PrepareError(f"expected a JSON object, got {type(rec).__name__}")
    msgs = _messages(rec)
    if msgs is not None:
        text, spans = chat_spans(tok, msgs)
        return tokenize_spans(tok, text, spans)
    if "prompt" in rec or "completion" in rec:
        p, c = rec.get("prompt"), rec.get("completion")
        if not isinstance(p, str) or not isinstance(c, str):
            raise PrepareError('"prompt" and "completion" must both be strings')
        return tokenize_spans(tok, p + c, [(len(p), len(p) + len(c))])
    if "text" in rec:
        if not isinstance(rec["text"], str):
            raise PrepareError('"text" must be a string')
        return tokenize_spans(tok, rec["text"], [(0, len(rec["text"]))])
    raise PrepareError('expected "messages", "conversations", "prompt"/"completion" or "text"')


class ShardWriter:
    def __init__(self, out_dir: str, shard_size: int):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.shard_size = out_dir, shard_size
        self.n = 0
        self._f = None

    def add(self, ids: list[int], mask: list[int]) -> None:
        if self._f is None or self.n % self.shard_size == 0:
            self.close()
            path = os.path.join(self.out_dir, f"part-{self.n // self.shard_size:05d}.jsonl")
            self._f = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._f.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
        self.n += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def is_heldout(line: str, fraction: float) -> bool:
    """Deterministic by content: a line's hash below ``fraction`` of the range."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(line.strip().encode("utf-8")).digest()[:8], "big")
    return h < fraction * 2**64


def prepare(
    tok,
    inputs: list[str],
    out_dir: str,
    *,
    max_seq_len: int | None = None,
    shard_size: int = 100_000,
    heldout_fraction: float = 0.0,
) -> dict:
    w = ShardWriter(out_dir, shard_size)
    held = ShardWriter(os.path.join(out_dir, "heldout"), shard_size) if heldout_fraction > 0 else None
    stats = {"sequences": 0, "tokens": 0, "trained_tokens": 0, "skipped_empty": 0}
    if held is not None:
        stats["heldout_sequences"] = 0
    try:
        for path in inputs:
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        ids, mask = encode_record(tok, json.loads(line))
                    except json.JSONDecodeError as e:
                        raise PrepareError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                    except PrepareError as e:
                        raise PrepareError(f"{path}:{lineno}: {e}") from None
                    if max_seq_len:
                        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
                    if not any(mask[1:]):
                        stats["skipped_empty"] += 1
                        continue
                    if held is not None and is_heldout(line, heldout_fraction):
                        held.add(ids, mask)
                        stats["heldout_sequences"] += 1
                        continue
                    w.add(ids, mask)
                    stats["sequences"] += 1
                    stats["tokens"] += len(ids)
                    stats["trained_tokens"] += sum(mask)
    finally:
        w.close()
        if held is not None:
            held.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare", description=__doc__.split("\n")[0])
    p.add_argument(
        "--tokenizer", required=True, help="target model directory (AutoTokenizer, local files only)"
    )
    p.add_argument("--input", required=True, nargs="+", help="chat/completion JSONL file(s)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-seq-len", type=int, default=None, help="truncate longer sequences")
    p.add_argument("--shard-size", type=int, default=100_000, help="sequences per output file")
    p.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.0,
        help="this fraction of the sequences goes to DATA_DIR/heldout/ (evaluation prompts), not to training",
    )
    a = p.parse_args(argv)
    if not 0.0 <= a.heldout_fraction < 1.0:
        print(f"error: --heldout-fraction: must be in [0, 1), got {a.heldout_fraction}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.tokenizer, local_files_only=True)
    try:
        stats = prepare(
            tok,
            a.input,
            a.output_dir,
            max_seq_len=a.max_seq_len,
            shard_size=a.shard_size,
            heldout_fraction=a.heldout_fraction,
        )
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(stats), flush=True)
    return 0
