"""Evaluation prompts from a JSONL file or a directory of them (``python -m trainer.prepare``'s output, e.g.
its held-out split).

One JSON object a line:
- ``{"input_ids": [...]}`` (the training data format): token ids as they are. With a ``loss_mask`` whose
  first trained token comes after position 0 (a prepared chat or prompt/completion line), the prompt is the
  part before it (the conversation up to the reply, what a server is asked to continue); otherwise (plain
  text, no mask) the first ``prompt_len`` tokens;
- ``{"messages": [...]}`` / ``{"conversations": [...]}``: the turns before the last assistant turn, rendered
  with the target's chat template and the generation prompt;
- ``{"prompt": "..."}``: the text; ``{"text": "..."}``: its first ``prompt_len`` tokens.
Prompts are cut to their last ``max_prompt_len`` tokens. A malformed line is an ``EvalError`` naming it.
"""

from __future__ import annotations

import glob
import json
import os

from trainer.data.dataset import json_error
from trainer.evaluation.load import EvalError


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.jsonl")))
        if not files:
            raise EvalError(f"--prompts: directory {path!r} has no *.jsonl file")
        return files
    if not os.path.isfile(path):
        raise EvalError(f"--prompts: {path!r} does not exist")
    return [path]


def _from_ids(rec: dict, prompt_len: int) -> list[int]:
    ids = rec["input_ids"]
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise EvalError("input_ids must be a list of integers")
    mask = rec.get("loss_mask")
    if isinstance(mask, list) and len(mask) == len(ids):
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is not None and first > 0:
            return ids[:first]
    return ids[:prompt_len]


def _from_text(rec: dict, tokenizer, prompt_len: int) -> list[int]:
    from trainer.data.tokenizing import PrepareError, _messages, _render

    if tokenizer is None:
        raise EvalError("a text prompt needs the target's tokenizer (none could be loaded)")
    try:
        msgs = _messages(rec)
    except PrepareError as e:
        raise EvalError(str(e)) from None
    if msgs is not None:
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=len(msgs))
        if last == 0:
            raise EvalError("the conversation has no turn before its first assistant turn")
        text = _render(tokenizer, msgs[:last], add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if isinstance(rec.get("prompt"), str):
        return list(tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"])
    if isinstance(rec.get("text"), str):
        return list(tokenizer(rec["text"], add_special_tokens=False)["input_ids"])[:prompt_len]
    raise EvalError('expected "input_ids", "messages", "conversations", "prompt" or "text"')


def read_prompts(
    path: str,
    tokenizer_loader,
    num_prompts: int | None = None,
    prompt_len: int = 64,
    max_prompt_len: int = 2048,
    vocab_size: int | None = None,
) -> list[list[int]]:
    """Up to ``num_prompts`` prompts (token id lists) in file order. ``tokenizer_loader()`` is called once,
    on the first line that needs a tokenizer."""
    out: list[list[int]] = []
    tok, tok_loaded = None, False
    for fn in _files(path):
        with open(fn, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if num_prompts is not None and len(out) >= num_prompts:
                    return out
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    if not isinstance(rec, dict):
                        raise EvalError("expected a JSON object")
                    if "input_ids" in rec:
                        ids = _from_ids(rec, prompt_len)
                    else:
                        if not tok_loaded:
                            tok, tok_loaded = tokenizer_loader(), True
                        ids = _from_text(rec, tok, prompt_len)
                except json.JSONDecodeError as e:
                    raise EvalError(json_error(f"{fn}:{lineno}", line, e)) from None
                except EvalError as e:
                    raise EvalError(f"{fn}:{lineno}: {e}") from None
                ids = ids[-max_prompt_len:]
                if not ids:
                    raise EvalError(f"{fn}:{lineno}: empty prompt")
                if vocab_size is not None and any(not 0 <= x < vocab_size for x in ids):
                    raise EvalError(
                        f"{fn}:{lineno}: a token id outside the target's vocabulary ({vocab_size})"
                    )
                out.append(ids)
    if not out:
        raise EvalError(f"--prompts: no prompt in {path!r}")
    return out
