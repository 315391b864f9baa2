"""Train/serve checks beyond the drafter's own config: the data's chat template and thinking mode against
what the server will apply, and the mask token against the target's tokenizer.

``Serving``: what ``trainer.export --check`` was told about serving (``--target``'s tokenizer files,
``--data``'s ``prepare.json``, ``--serve-thinking``). ``check(top, dc, target, serving)`` gives the same
problems for every server (the server applies the target's template and embedding whatever its loader).

- **chat template**: the SHA-256 of the template ``trainer.prepare`` rendered the data with against the
  target's (``chat_template.jinja`` or tokenizer_config.json's, what vLLM and SGLang apply without
  ``--chat-template``); a drafter trained on other text than the server shows it accepts less.
- **thinking**: ``prepare.json``'s ``prompt_thinking`` (the generation prompt had thinking on / off) against
  ``--serve-thinking``; thinking served on needs thinking trained (``--thinking keep`` and some thinking
  tokens in the data): the target then writes mostly thinking (users saw acceptance 25% -> 60% once it matched).
- **mask token**: below the target's vocabulary (its embedding rows) and no other token: not an
  eos / pad / bos id, not a token of the tokenizer's vocabulary, not an added token that text holds (every
  added token but a special one that is the tokenizer's ``mask_token`` or named as a mask). A mask id that is a real token makes the drafter's masked slots look
  like that token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainer.exporting.problems import Problem, error, shown, warning
from trainer.exporting.reader import ReadError, read_json_object
from trainer.exporting.target_files import Tokenizer
from trainer.exporting.templates import template_sha256

PREPARED = "prepare.json"
THINKING = ("on", "off")


@dataclass
class Serving:
    tokenizer: Tokenizer | None = None  # --target's tokenizer files
    data: dict | None = None  # --data's prepare.json
    data_problems: tuple = ()
    serve_thinking: str | None = None  # --serve-thinking on|off


def read_prepared(data_dir: str) -> tuple[dict | None, list[Problem]]:
    try:
        return read_json_object(os.path.join(data_dir, PREPARED)), []
    except ReadError as e:
        why = (
            "missing: the data was prepared before trainer.prepare recorded its chat template, or is no "
            "prepare output; prepare it again to check it"
            if str(e) == "missing"
            else str(e)
        )
        return None, [error(PREPARED, f"{shown(data_dir, 200)}/{PREPARED} {why}")]


def _short(h: object) -> str:
    return shown(h[:12] + "...") if isinstance(h, str) else shown(h)


def _template(data: dict, tok: Tokenizer | None) -> list[Problem]:
    if tok is None:
        return []
    mine, theirs = data.get("chat_template_sha256"), template_sha256(tok.chat_template)
    if mine == theirs:
        return []
    return [
        error(
            "chat_template",
            f"the data was rendered with template sha256 {_short(mine)} (prepare.json), the target's "
            f"tokenizer applies {_short(theirs)}: prepare the data again with --tokenizer set to the "
            "target, or serve with the data's template (--chat-template)",
        )
    ]


def _thinking(data: dict, serve: str | None) -> list[Problem]:
    if serve is None:
        return []
    mine = data.get("prompt_thinking")
    out = []
    if mine in THINKING and mine != serve:
        out.append(
            error(
                "enable_thinking",
                f"the data was prepared with thinking {mine} (chat_template_kwargs "
                f"{shown(data.get('chat_template_kwargs'))}), the server renders with thinking {serve}: "
                f"prepare with --chat-template-kwargs '{{\"enable_thinking\": {str(serve == 'on').lower()}}}', "
                f'or serve with chat_template_kwargs {{"enable_thinking": {str(mine == "on").lower()}}}',
            )
        )
    if serve == "on" and (data.get("thinking") != "keep" or data.get("trained_thinking_tokens") == 0):
        how = (
            f"--thinking {shown(data.get('thinking'))}"
            if data.get("thinking") != "keep"
            else "no trained token inside <think>"
        )
        out.append(
            error(
                "thinking",
                f"the data trains no thinking ({how}); served with thinking on, the target writes it "
                "first: prepare data that has thinking with --thinking keep, or serve with thinking off",
            )
        )
    return out


def _mask(top: dict, dc: dict, target, tok: Tokenizer | None) -> list[Problem]:
    mask = dc.get("mask_token_id", top.get("mask_token_id"))
    if type(mask) is not int:
        return []  # each server's own rule names it
    vocab = getattr(target, "vocab_size", None)
    if vocab is not None and not 0 <= mask < vocab and top.get("vocab_size") != vocab:
        return [
            error(
                "dflash_config.mask_token_id",
                f"{mask} is not a row of the target's embedding (vocab_size {vocab}): the server looks it "
                "up there; use an unused row below it",
            )
        ]
    if tok is None:
        return []
    fix = "use a row no token maps to (e.g. vocab_size - 1 on a padded vocabulary) or a dedicated mask token"
    if mask in tok.special:
        return [error("dflash_config.mask_token_id", f"{mask} is the target's {tok.special[mask]}: {fix}")]
    content, special = tok.added.get(mask, (None, False))
    named_mask = special and (content == tok.mask_token or "mask" in (content or "").lower())
    if named_mask:
        return []  # the tokenizer's own mask token (an added token matches before the vocabulary's pieces)
    if content is not None:
        return [
            error(
                "dflash_config.mask_token_id",
                f"{mask} is the added token {shown(content)}, which text and chat templates hold: {fix}",
            )
        ]
    if tok.vocab is not None and mask in tok.vocab:
        return [error("dflash_config.mask_token_id", f"{mask} is a token of the target's vocabulary: {fix}")]
    if tok.vocab is None:
        return [warning("tokenizer.json", "not read: whether the mask token is a real token is not checked")]
    return []


def check(top: dict, dc: dict, target, serving: Serving | None) -> list[Problem]:
    if serving is None:
        return _mask(top, dc, target, None)
    out = _mask(top, dc, target, serving.tokenizer) + list(serving.data_problems)
    if serving.tokenizer is not None:
        out += serving.tokenizer.problems
    if serving.data is not None:
        out += _template(serving.data, serving.tokenizer) + _thinking(serving.data, serving.serve_thinking)
    return out
