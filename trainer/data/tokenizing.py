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
A malformed input line stops the run with a message naming the file and line (and column for JSON), an unknown
role too (``trainer.data.chat.ROLES``); nothing of the run's output is left then. ``--output-dir`` must be new or
empty, or ``--overwrite`` removes an earlier prepare's output first (``trainer.data.output_dir``). More than 5%
of the tokens being the tokenizer's unknown token is refused unless ``--allow-unk``
(``trainer.data.unknown_tokens``); every line gets ``"unk"``, its count, when the tokenizer has such a token.

Chats (``trainer.data.chat``): ``--chat-template-kwargs JSON`` goes to ``apply_chat_template`` (a record's
``tools`` too; messages keep ``tool_calls``, ``reasoning_content``, ``name``, ``tool_call_id``); ``--thinking
keep|drop|mask`` (mask: in the text, not trained); ``--turns all|last|split``: every assistant turn trained in one sequence, only the
last one, or one sequence per turn (the earlier turns untrained history). Every
line also gets ``"roles"``: ``[[role, n_tokens], ...]`` runs (system / user / tool / assistant / thinking /
template; prompt / completion; text), which the trainer ignores and the report reads. Before anything is
written, the first ``--served-check N`` chats are rendered as the server would (``trainer.data.served``, with
``--served-template-kwargs``, default the training ones); a difference stops with exit status 2.
``DATA_DIR/prepare.json`` records the chat template's hash, the template kwargs and the thinking setting
(``trainer.data.prepared_meta``), for ``trainer.export --check --data``.
``--report DATA_DIR``: the data report instead (``trainer.data.data_report``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field

from trainer.data import prepared_meta
from trainer.data.chat import (  # noqa: F401  (_messages, _render: used by evaluation and regeneration)
    RESERVED_KWARGS,
    ROLE_ALIASES,
    THINKING_MODES,
    PrepareError,
    Render,
    _messages,
    _render,
    drop_thinking,
    record_tools,
    render_chat,
)
from trainer.data.data_report import add_report_flags, report_main
from trainer.data.dataset import json_error
from trainer.data.output_dir import claim
from trainer.data.served import check_served
from trainer.data.unknown_tokens import UNK_LIMIT, UnknownTokens


@dataclass(frozen=True)
class ChatOptions:
    """How chat records are rendered and trained (the flags of the same names)."""

    template_kwargs: dict = field(default_factory=dict)
    thinking: str = "keep"
    turns: str = "all"  # all | last | split
    served_kwargs: dict | None = None  # None: the training kwargs
    served_check: int = 8  # chat records checked against the served rendering


DEFAULT_OPTIONS = ChatOptions()
TURN_MODES = ("all", "last", "split")
Encoded = tuple[list[int], list[int], list[list]]  # input_ids, loss_mask, roles ([role, n_tokens] runs)


def chat_spans(tok, msgs: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    r = render_chat(tok, msgs, Render())
    return r.text, r.trained


def _run_lengths(labels: list[str]) -> list[list]:
    runs: list[list] = []
    for x in labels:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return runs


def tokenize_spans(tok, text: str, spans, roles=None) -> Encoded:
    """Token ids of ``text``, a mask of the tokens that start inside one of ``spans`` and the run lengths
    of the tokens' roles (``roles``: (start, end, role) character spans, first match wins; else "template")."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask, labels = [], []
    for a, b in enc["offset_mapping"]:
        inside = any(s <= a < e or (a == b and s < a <= e) for s, e in spans)
        mask.append(1 if inside else 0)
        c = a - 1 if a == b and a > 0 else a
        labels.append(next((r for s, e, r in roles or () if s <= c < e), "template"))
    return ids, mask, _run_lengths(labels)


def encode_chat(tok, msgs: list[dict], tools, opt: ChatOptions, check: bool = False) -> list[Encoded]:
    """One sequence (``turns`` split: one per assistant turn); ``check``: against the served text."""
    if opt.thinking == "drop":
        msgs = drop_thinking(msgs)
    render = Render(opt.template_kwargs, tools)
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if opt.turns == "split":
        convs = [(msgs[: i + 1], [i]) for i in turns]
    else:
        convs = [(msgs, turns[-1:] if opt.turns == "last" else turns)]
    out = []
    for conv, trained_turns in convs:
        r = render_chat(tok, conv, render, opt.thinking, last_only=opt.turns != "all")
        if check:
            served = opt.template_kwargs if opt.served_kwargs is None else opt.served_kwargs
            check_served(tok, conv, r.text, Render(served, tools), trained_turns)
        out.append(tokenize_spans(tok, r.text, r.trained, r.roles))
    return out


def encode_record(tok, rec, opt: ChatOptions = DEFAULT_OPTIONS, check: bool = False) -> list[Encoded]:
    """The sequences of one input record."""
    if not isinstance(rec, dict):
        raise PrepareError(f"expected a JSON object, got {type(rec).__name__}")
    msgs = _messages(rec)
    if msgs is not None:
        return encode_chat(tok, msgs, record_tools(rec), opt, check)
    if "prompt" in rec or "completion" in rec:
        p, c = rec.get("prompt"), rec.get("completion")
        if not isinstance(p, str) or not isinstance(c, str):
            raise PrepareError('"prompt" and "completion" must both be strings')
        n = len(p) + len(c)
        return [tokenize_spans(tok, p + c, [(len(p), n)], [(0, len(p), "prompt"), (len(p), n, "completion")])]
    if "text" in rec:
        if not isinstance(rec["text"], str):
            raise PrepareError('"text" must be a string')
        n = len(rec["text"])
        return [tokenize_spans(tok, rec["text"], [(0, n)], [(0, n, "text")])]
    raise PrepareError('expected "messages", "conversations", "prompt"/"completion" or "text"')


class ShardWriter:
    def __init__(self, out_dir: str, shard_size: int):
        self.made_dir = not os.path.isdir(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.shard_size = out_dir, shard_size
        self.n = 0
        self.paths: list[str] = []  # the files written
        self._f = None

    def add(
        self, ids: list[int], mask: list[int], roles: list[list] | None = None, unk: int | None = None
    ) -> None:
        if self._f is None or self.n % self.shard_size == 0:
            self.close()
            path = os.path.join(self.out_dir, f"part-{self.n // self.shard_size:05d}.jsonl")
            self._f = open(path, "w", encoding="utf-8")  # noqa: SIM115
            self.paths.append(path)
        rec = {"input_ids": ids, "loss_mask": mask}
        if roles is not None:
            rec["roles"] = roles
        if unk is not None:
            rec["unk"] = unk
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.n += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def discard(self) -> None:
        """Remove what this writer wrote (and its directory when it made it and it is empty now)."""
        self.close()
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self.made_dir and not os.listdir(self.out_dir):
            os.rmdir(self.out_dir)


def is_heldout(line: str, fraction: float) -> bool:
    """Deterministic by content: a line's hash below ``fraction`` of the range."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(line.strip().encode("utf-8")).digest()[:8], "big")
    return h < fraction * 2**64


def _truncate_roles(roles: list[list], n: int) -> list[list]:
    out, left = [], n
    for r, k in roles:
        if left <= 0:
            break
        out.append([r, min(k, left)])
        left -= k
    return out


def _lines(path: str):
    """(line number, line) of one input file; PrepareError naming the file (and line) when it cannot be read."""
    lineno = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 - the last one read names a decoding error
                yield lineno, line
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise PrepareError(f"--input: {path!r}: {e.strerror or e}") from None


def _records(inputs: list[str]):
    """(where, raw line, record) of every non-blank input line; PrepareError naming the line if not JSON."""
    for path in inputs:
        for lineno, line in _lines(path):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(json_error(f"{path}:{lineno}", line, e)) from None
            yield f"{path}:{lineno}", line, rec


def check_inputs_served(tok, inputs: list[str], opt: ChatOptions) -> int:
    """The served-text check on the first ``opt.served_check`` chat records; how many were checked."""
    done = 0
    for where, _, rec in _records(inputs):
        if done >= opt.served_check:
            break
        if isinstance(rec, dict) and ("messages" in rec or "conversations" in rec):
            try:
                encode_record(tok, rec, opt, check=True)
            except PrepareError as e:
                raise type(e)(f"{where}: {e}") from None
            done += 1
    return done


def prepare(
    tok,
    inputs: list[str],
    out_dir: str,
    *,
    max_seq_len: int | None = None,
    shard_size: int = 100_000,
    heldout_fraction: float = 0.0,
    options: ChatOptions = DEFAULT_OPTIONS,
    max_unk_share: float | None = UNK_LIMIT,
) -> dict:
    """Tokenize ``inputs`` into ``out_dir``; the counts. A PrepareError (a bad line, too many unknown tokens
    above ``max_unk_share``; None: any share) leaves nothing of this run's output behind."""
    stats = {"served_checked": check_inputs_served(tok, inputs, options)}
    stats.update(sequences=0, tokens=0, trained_tokens=0, skipped_empty=0, truncated=0)
    unknown = UnknownTokens.of(tok, max_unk_share)
    w = ShardWriter(out_dir, shard_size)
    trained_thinking = 0
    held = ShardWriter(os.path.join(out_dir, "heldout"), shard_size) if heldout_fraction > 0 else None
    if held is not None:
        stats["heldout_sequences"] = 0
    try:
        for where, line, rec in _records(inputs):
            try:
                seqs = encode_record(tok, rec, options)
            except PrepareError as e:
                raise PrepareError(f"{where}: {e}") from None
            for ids, mask, roles in seqs:
                if max_seq_len and len(ids) > max_seq_len:
                    ids, mask, roles = (
                        ids[:max_seq_len],
                        mask[:max_seq_len],
                        _truncate_roles(roles, max_seq_len),
                    )
                    stats["truncated"] += 1
                if not any(mask[1:]):
                    stats["skipped_empty"] += 1
                    continue
                unk = unknown.count(ids)
                if held is not None and is_heldout(line, heldout_fraction):
                    held.add(ids, mask, roles, unk)
                    stats["heldout_sequences"] += 1
                    continue
                w.add(ids, mask, roles, unk)
                stats["sequences"] += 1
                stats["tokens"] += len(ids)
                stats["trained_tokens"] += sum(mask)
                trained_thinking += prepared_meta.thinking_tokens(mask, roles)
        unknown.check()
    except BaseException:
        for writer in (held, w):
            if writer is not None:
                writer.discard()
        raise
    finally:
        w.close()
        if held is not None:
            held.close()
    meta = prepared_meta.record(
        tok, options.template_kwargs, options.thinking, stats["trained_tokens"], trained_thinking
    )
    prepared_meta.write(out_dir, meta)
    return {**stats, **unknown.stats()}


def json_object(flag: str, text: str) -> dict:
    """``text`` parsed as a JSON object, or PrepareError naming ``flag``."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise PrepareError(f"{flag}: not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    if not isinstance(v, dict):
        raise PrepareError(f'{flag}: must be a JSON object like {{"enable_thinking": false}}, got {text!r}')
    taken = [k for k in RESERVED_KWARGS if k in v]
    if taken:
        raise PrepareError(f"{flag}: {', '.join(taken)} cannot be set here (prepare sets it)")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare", description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", help="target model directory (AutoTokenizer, local files only)")
    p.add_argument("--input", nargs="+", help="chat/completion JSONL file(s)")
    p.add_argument("--output-dir")
    p.add_argument("--max-seq-len", type=int, default=None, help="truncate longer sequences")
    p.add_argument("--shard-size", type=int, default=100_000, help="sequences per output file")
    p.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.0,
        help="this fraction of the sequences goes to DATA_DIR/heldout/ (evaluation prompts), not to training",
    )
    p.add_argument(
        "--chat-template-kwargs",
        default="{}",
        help='JSON object for the template, e.g. {"enable_thinking": false}',
    )
    p.add_argument(
        "--thinking",
        choices=THINKING_MODES,
        default="keep",
        help="thinking blocks: kept, dropped, or kept untrained",
    )
    p.add_argument(
        "--turns",
        choices=TURN_MODES,
        default="all",
        help="assistant turns trained: all (one sequence), last (e.g. regenerated replies), split (one sequence each)",
    )
    p.add_argument(
        "--served-template-kwargs",
        default=None,
        help="the server's template kwargs (default: --chat-template-kwargs)",
    )
    p.add_argument(
        "--served-check",
        type=int,
        default=8,
        help="chat records checked against the served rendering (0: off)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="a used --output-dir: remove an earlier prepare's output first (part-*.jsonl, heldout/; nothing else)",
    )
    p.add_argument(
        "--allow-unk",
        action="store_true",
        help=f"prepare even when over {UNK_LIMIT:.0%} of the tokens are the tokenizer's unknown token",
    )
    add_report_flags(p)
    return p


def _options(a) -> ChatOptions:
    kwargs = json_object("--chat-template-kwargs", a.chat_template_kwargs)
    served = (
        None
        if a.served_template_kwargs is None
        else json_object("--served-template-kwargs", a.served_template_kwargs)
    )
    if a.served_check < 0:
        raise PrepareError(f"--served-check: must be >= 0, got {a.served_check}")
    return ChatOptions(kwargs, a.thinking, a.turns, served, a.served_check)


def load_tokenizer(path: str):
    """The local tokenizer of ``--tokenizer`` (nothing downloaded), or PrepareError in one line."""
    if not os.path.isdir(path):
        raise PrepareError(
            f"--tokenizer: {path!r} is not a directory (a local model directory; nothing is downloaded)"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises for a directory it cannot read
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise PrepareError(
            f"--tokenizer: no tokenizer could be read from {path!r} ({type(e).__name__}: {why})"
        ) from None


def check_inputs(inputs: list[str]) -> None:
    for path in inputs:
        if not os.path.exists(path):
            raise PrepareError(f"--input: {path!r}: no such file")
        if not os.path.isfile(path):
            raise PrepareError(f"--input: {path!r} is not a file")


def _run(a, options: ChatOptions) -> dict:
    """Check the inputs and the output directory, load the tokenizer, then prepare; PrepareError in one line."""
    check_inputs(a.input)
    claim(a.output_dir, a.overwrite, remove=False)  # a used directory is refused before anything loads
    tok = load_tokenizer(a.tokenizer)
    claim(a.output_dir, a.overwrite)
    return prepare(
        tok,
        a.input,
        a.output_dir,
        max_seq_len=a.max_seq_len,
        shard_size=a.shard_size,
        heldout_fraction=a.heldout_fraction,
        options=options,
        max_unk_share=None if a.allow_unk else UNK_LIMIT,
    )


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.report is not None:
        return report_main(a)
    missing = [
        f
        for f, v in (("--tokenizer", a.tokenizer), ("--input", a.input), ("--output-dir", a.output_dir))
        if not v
    ]
    if missing:
        print(f"error: {', '.join(missing)}: required (or --report DATA_DIR)", file=sys.stderr)
        return 2
    if not 0.0 <= a.heldout_fraction < 1.0:
        print(f"error: --heldout-fraction: must be in [0, 1), got {a.heldout_fraction}", file=sys.stderr)
        return 2
    try:
        stats = _run(a, _options(a))
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(stats), flush=True)
    return 0
