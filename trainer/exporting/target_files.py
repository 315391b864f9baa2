"""What the train/serve checks read from a target directory besides config.json, bounded, never followed
through a symbolic link (``reader``'s rules).

``read_tokenizer(dir) -> Tokenizer``: the chat template the server applies (``chat_template.jinja``, else
tokenizer_config.json's ``chat_template``), its ``mask_token``, the special ids (``eos``/``pad``/``bos`` token ids of config.json,
generation_config.json and tokenizer_config.json's tokens), the ids of the tokenizer's vocabulary
(tokenizer.json ``model.vocab``) and its added tokens (``{id: (content, special)}``); ``problems`` says what
could not be read (a warning: that part is not checked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainer.exporting.problems import Problem, shown, warning
from trainer.exporting.reader import ReadError, _open_regular, _read_exactly, read_json_object
from trainer.exporting.templates import template_text

TOKENIZER_CAP = 256 << 20  # tokenizer.json: ~11 MB for Qwen3, ~33 MB for Gemma
TEMPLATE_CAP = 4 << 20
SPECIAL_KEYS = ("eos_token_id", "pad_token_id", "bos_token_id")
TOKEN_KEYS = ("eos_token", "pad_token", "bos_token", "unk_token")


@dataclass
class Tokenizer:
    chat_template: str | None = None
    special: dict[int, str] = field(default_factory=dict)  # id -> what it is ("eos_token_id in config.json")
    vocab: set[int] | None = None  # the BPE/unigram vocabulary's ids (None: not read)
    added: dict[int, tuple[str, bool]] = field(default_factory=dict)  # id -> (content, special)
    mask_token: str | None = None  # tokenizer_config.json's mask_token
    problems: list[Problem] = field(default_factory=list)


def _json(path: str, cap: int, tok: Tokenizer) -> dict | None:
    if not os.path.lexists(path):
        return None
    try:
        return read_json_object(path, cap)
    except ReadError as e:
        tok.problems.append(warning(os.path.basename(path), f"{e}: not checked"))
        return None


def _ids(v: object) -> list[int]:
    vals = v if isinstance(v, list) else [v]
    return [i for i in vals if type(i) is int]


def _template(path: str, tc: dict | None, tok: Tokenizer) -> str | None:
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.lexists(jinja):
        try:
            fd, size = _open_regular(jinja)
            try:
                if size > TEMPLATE_CAP:
                    raise ReadError(f"is {size} bytes, more than {TEMPLATE_CAP}")
                return _read_exactly(fd, size, 0).decode("utf-8")
            finally:
                os.close(fd)
        except (ReadError, UnicodeDecodeError) as e:
            tok.problems.append(warning("chat_template.jinja", f"{e}: not checked"))
            return None
    return template_text((tc or {}).get("chat_template"))


def _content(v: object) -> str | None:
    return v.get("content") if isinstance(v, dict) else v if isinstance(v, str) else None


def read_tokenizer(path: str) -> Tokenizer:
    tok = Tokenizer()
    tc = _json(os.path.join(path, "tokenizer_config.json"), TOKENIZER_CAP, tok)
    tj = _json(os.path.join(path, "tokenizer.json"), TOKENIZER_CAP, tok)
    tok.chat_template = _template(path, tc, tok)
    for name in ("config.json", "generation_config.json"):
        d = _json(os.path.join(path, name), TOKENIZER_CAP, tok) or {}
        d = d.get("text_config") if isinstance(d.get("text_config"), dict) else d
        for key in SPECIAL_KEYS:
            for i in _ids(d.get(key)):
                tok.special.setdefault(i, f"{key} in {name}")
    for i, t in ((tc or {}).get("added_tokens_decoder") or {}).items():
        if isinstance(t, dict) and isinstance(t.get("content"), str) and str(i).isdigit():
            tok.added[int(i)] = (t["content"], t.get("special") is True)
    for t in (tj or {}).get("added_tokens") or []:
        if isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str):
            tok.added.setdefault(t["id"], (t["content"], t.get("special") is True))
    by_content = {c: i for i, (c, _) in tok.added.items()}
    for key in TOKEN_KEYS:
        c = _content((tc or {}).get(key))
        if c in by_content:
            tok.special.setdefault(by_content[c], f"{key} {shown(c)} in tokenizer_config.json")
    tok.mask_token = _content((tc or {}).get("mask_token"))
    vocab = ((tj or {}).get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        tok.vocab = {i for i in vocab.values() if type(i) is int}
    elif isinstance(vocab, list):  # unigram: [[piece, score], ...], ids by position
        tok.vocab = set(range(len(vocab)))
    return tok
