"""Chat templates as the train/serve check compares them: the template text a tokenizer applies and its hash.

``template_text(chat_template)``: transformers' ``tokenizer.chat_template`` (a string, or a map of named
templates: its ``"default"``; a list of ``{"name", "template"}`` as tokenizer_config.json stores several) as
the one string a plain chat request renders with, or None. ``template_sha256(text)``: the hex SHA-256 of its
UTF-8, or None. ``trainer.prepare`` records the hash in ``DATA_DIR/prepare.json``; ``trainer.export --check
--data`` computes it again from the target's files (``target_files``). Imports nothing else.
"""

from __future__ import annotations

import hashlib


def template_text(chat_template: object) -> str | None:
    if isinstance(chat_template, str):
        return chat_template or None
    if isinstance(chat_template, dict):
        return template_text(chat_template.get("default"))
    if isinstance(chat_template, list):
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        return template_text(named.get("default"))
    return None


def template_sha256(text: str | None) -> str | None:
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None
