"""Tokenized training data: loading, validation and deterministic packing into micro-batches.

Format (docs/trainer.md): ``--data-dir`` holds ``*.jsonl`` files (read in name order); each non-blank
line is one sequence ``{"input_ids": [int, ...], "loss_mask": [0|1, ...]}``. ``loss_mask`` is optional
(default: every token is trained) and must match ``input_ids`` in length; 1 marks completion tokens the
drafter learns to predict. Other keys are ignored. A malformed line raises ``DataError`` naming the file
and line (a line over ``MAX_LINE_CHARS`` characters, JSON nested too deeply, a token id beyond int64
included). Sequences longer than ``--max-seq-len`` are truncated; sequences with no trained token (or
fewer than 2 tokens) are dropped.

Packing: each epoch shuffles the sequences with ``numpy.random.default_rng([seed, epoch])`` and fills
micro-batches in that order, closing one when the next sequence would exceed ``--token-budget`` tokens
or ``--max-batch-size`` sequences. A micro-batch is ONE packed row: sequences concatenated, with
``doc_ids`` (0, 1, ... per sequence) and ``position_ids`` restarting at 0 for each sequence. The stream
of micro-batches runs on across epochs; the global index of a micro-batch is the data cursor a
checkpoint stores, so a resumed run sees exactly the batches an uninterrupted one would.

Held-out sequences (``--est-holdout N``): ``N`` sequences, drawn once from ``(seed, HOLDOUT_SALT)``, leave the
epochs; the others are packed with one sequence and the longest held-out one's tokens less room, and micro-batch
``g`` ends with held-out sequence ``g mod N`` (the row's last document). The trainer measures its estimate
there and trains nothing on it (``runtime.roles``): a drafter's estimate on text it has never trained on.

Nothing here imports torch except ``MicroBatch.to_tensors``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """Malformed or unusable data; the message names the file and line where there is one."""


@dataclass
class Dataset:
    tokens: np.ndarray  # int64, all sequences concatenated
    mask: np.ndarray  # bool, same length
    offsets: np.ndarray  # int64, n + 1 entries
    source_file: np.ndarray  # int32 index into files, per sequence
    source_line: np.ndarray  # int32 1-based line number, per sequence
    files: list[str]
    truncated: int = 0
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def where(self, i: int) -> str:
        return f"{self.files[self.source_file[i]]}:{self.source_line[i]}"

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(np.asarray(len(self), dtype=np.int64).tobytes())
        h.update(self.offsets.tobytes())
        h.update(self.tokens[: 1 << 20].tobytes())
        return h.hexdigest()[:16]

    def check_vocab(self, vocab_size: int) -> None:
        """Raise DataError naming the first sequence holding a token id >= vocab_size."""
        if len(self.tokens) == 0 or int(self.tokens.max()) < vocab_size:
            return
        pos = int(np.argmax(self.tokens >= vocab_size))
        i = int(np.searchsorted(self.offsets, pos, side="right") - 1)
        raise DataError(
            f"{self.where(i)}: token id {int(self.tokens[pos])} is outside the target's vocabulary "
            f"(vocab_size={vocab_size})"
        )


INT64_MAX = 2**63 - 1
MAX_LINE_CHARS = 64 << 20  # one sequence's line; a longer one is refused (not read whole into memory)


def _fail(path: str, lineno: int, msg: str) -> DataError:
    return DataError(f"{path}:{lineno}: {msg}")


def json_error(where: str, line: str, e: json.JSONDecodeError) -> str:
    """``WHERE:COLUMN: not valid JSON (...)`` for one JSONL line (``where``: ``FILE:LINE``). The column is
    counted in the line without its newline: json's own lineno/colno put a line that ends early (a torn
    write) at "line 2 column 1", past the newline, where the break is at the line's end."""
    body = line.rstrip("\r\n")
    col = min(e.pos, len(body)) + 1
    torn = ", where the line ends: cut short?" if e.pos >= len(body) else ""
    return f"{where}:{col}: not valid JSON ({e.msg.removesuffix(' at')} at column {col}{torn})"


def _int_list(path: str, lineno: int, key: str, v) -> list[int]:
    if not isinstance(v, list):
        raise _fail(path, lineno, f'"{key}" must be a list of integers, got {type(v).__name__}')
    for x in v:
        if not isinstance(x, int) or isinstance(x, bool):
            raise _fail(path, lineno, f'"{key}" must hold integers only, found {x!r}')
    return v


def parse_line(path: str, lineno: int, line: str) -> tuple[list[int], list[int]] | None:
    """(input_ids, loss_mask) of one JSONL line; None for a blank line; DataError when malformed."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(json_error(f"{path}:{lineno}", line, e)) from None
    except RecursionError:
        raise _fail(path, lineno, "JSON nested too deeply") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise _fail(path, lineno, f"not valid JSON ({str(e)[:120]})") from None
    if not isinstance(rec, dict):
        raise _fail(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
    if "input_ids" not in rec:
        raise _fail(path, lineno, 'missing "input_ids"')
    ids = _int_list(path, lineno, "input_ids", rec["input_ids"])
    if any(x < 0 for x in ids):
        raise _fail(path, lineno, '"input_ids" holds a negative token id')
    big = next((x for x in ids if x > INT64_MAX), None)
    if big is not None:  # np.int64 cannot hold it (OverflowError); check_vocab would refuse it anyway
        raise _fail(
            path, lineno, f'"input_ids" holds token id {str(big)[:40]}, beyond any vocabulary (int64)'
        )
    if "loss_mask" in rec:
        lm = rec["loss_mask"]
        if not isinstance(lm, list):
            raise _fail(path, lineno, '"loss_mask" must be a list of 0/1')
        lm = [int(x) if isinstance(x, bool) else x for x in lm]
        if any(x not in (0, 1) or not isinstance(x, int) for x in lm):
            raise _fail(path, lineno, '"loss_mask" must hold only 0 and 1')
        if len(lm) != len(ids):
            raise _fail(path, lineno, f'"loss_mask" has {len(lm)} entries but "input_ids" has {len(ids)}')
    else:
        lm = [1] * len(ids)
    return ids, lm


def data_files(data_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(data_dir, "*.jsonl")))


def load_dir(data_dir: str, max_seq_len: int) -> Dataset:
    files = data_files(data_dir)
    if not files:
        raise DataError(f"--data-dir {data_dir!r} holds no *.jsonl files")
    tok_chunks: list[np.ndarray] = []
    mask_chunks: list[np.ndarray] = []
    lengths: list[int] = []
    src_file: list[int] = []
    src_line: list[int] = []
    truncated = dropped = 0
    for fi, path in enumerate(files):
        with open(path, encoding="utf-8", errors="strict") as f:
            lineno = 0
            while True:
                try:
                    line = f.readline(MAX_LINE_CHARS + 1)
                except UnicodeDecodeError as e:
                    raise _fail(path, lineno + 1, f"not UTF-8 text ({e.reason})") from None
                if not line:
                    break
                lineno += 1
                if len(line) > MAX_LINE_CHARS:
                    raise _fail(path, lineno, f"a line longer than {MAX_LINE_CHARS} characters")
                parsed = parse_line(path, lineno, line)
                if parsed is None:
                    continue
                ids, lm = parsed
                if len(ids) > max_seq_len:
                    ids, lm = ids[:max_seq_len], lm[:max_seq_len]
                    truncated += 1
                # position 0 is never predicted (the anchor needs a token before it)
                if len(ids) < 2 or not any(lm[1:]):
                    dropped += 1
                    continue
                tok_chunks.append(np.asarray(ids, dtype=np.int64))
                mask_chunks.append(np.asarray(lm, dtype=bool))
                lengths.append(len(ids))
                src_file.append(fi)
                src_line.append(lineno)
    if not lengths:
        raise DataError(
            f"--data-dir {data_dir!r}: no usable sequence (each needs >= 2 tokens and a trained token)"
        )
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Dataset(
        tokens=np.concatenate(tok_chunks),
        mask=np.concatenate(mask_chunks),
        offsets=offsets,
        source_file=np.asarray(src_file, dtype=np.int32),
        source_line=np.asarray(src_line, dtype=np.int32),
        files=files,
        truncated=truncated,
        dropped=dropped,
    )


def pack_epoch(
    lengths: np.ndarray, seed: int, epoch: int, token_budget: int, max_batch_size: int
) -> list[np.ndarray]:
    """Micro-batches (arrays of sequence indices) of one epoch; deterministic in (seed, epoch)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    batches: list[np.ndarray] = []
    start, used = 0, 0
    for j, i in enumerate(order):
        n = int(lengths[i])
        if j > start and (used + n > token_budget or j - start >= max_batch_size):
            batches.append(order[start:j])
            start, used = j, 0
        used += n
    if len(order) > start:
        batches.append(order[start:])
    return batches


@dataclass
class MicroBatch:
    index: int  # global micro-batch index (the data cursor)
    epoch: int
    input_ids: np.ndarray  # (T,) int64, sequences packed into one row
    loss_mask: np.ndarray  # (T,) bool
    doc_ids: np.ndarray  # (T,) int64, 0..n_seq-1
    position_ids: np.ndarray  # (T,) int64, restarting per sequence

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to_tensors(self, device):
        """(input_ids, loss_mask, doc_ids, position_ids) as (1, T) tensors on ``device``."""
        import torch

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a)).unsqueeze(0).to(device)

        return t(self.input_ids), t(self.loss_mask), t(self.doc_ids), t(self.position_ids)


HOLDOUT_SALT = 0x4E1D  # the held-out sequences' draw: default_rng([seed, HOLDOUT_SALT])


def held_out(n_seqs: int, count: int, seed: int) -> np.ndarray:
    """The ``count`` held-out sequence indices of a dataset of ``n_seqs`` (sorted; deterministic in seed)."""
    if not 0 <= count < n_seqs:
        raise DataError(f"--est-holdout {count}: must be 0 (off) or fewer than the data's {n_seqs} sequences")
    picked = np.random.default_rng([seed, HOLDOUT_SALT]).choice(n_seqs, size=count, replace=False)
    return np.sort(picked).astype(np.int64)


class Plan:
    """The stream of micro-batches over ``epochs`` epochs; random access by global index. ``holdout`` N > 0:
    N held-out sequences, one at the end of every micro-batch (module docstring)."""

    def __init__(
        self, ds: Dataset, *, seed: int, epochs: int, token_budget: int, max_batch_size: int, holdout: int = 0
    ):
        self.ds = ds
        self.holdout = held_out(len(ds), holdout, seed)
        train = np.setdiff1d(np.arange(len(ds)), self.holdout)
        room, seqs = token_budget, max_batch_size
        if holdout:
            room, seqs = token_budget - int(ds.lengths[self.holdout].max()), max_batch_size - 1
            longest = int(ds.lengths[train].max())
            if seqs < 1 or longest > room:
                raise DataError(
                    f"--est-holdout {holdout}: a micro-batch holds a held-out sequence beside the others; the "
                    f"longest held-out ({token_budget - room} tokens) and the longest other ({longest}) need "
                    f"--token-budget >= {token_budget - room + longest} and --max-batch-size >= 2"
                )
        lengths = ds.lengths[train]
        self.epochs = [[train[b] for b in pack_epoch(lengths, seed, e, room, seqs)] for e in range(epochs)]
        self.starts = [0]
        for b in self.epochs:
            self.starts.append(self.starts[-1] + len(b))

    # The flags that decide which sequences micro-batch g holds: a resume must keep them, or its data cursor
    # would point into another stream (``--epochs`` is not one: a later epoch leaves the earlier ones as they are)
    RESUME_FLAGS = ("seed", "token_budget", "max_batch_size", "est_holdout")

    @classmethod
    def from_flags(cls, ds: Dataset, args) -> Plan:
        """The plan a run's flags give (``--seed``, ``--epochs``, ``--token-budget``, ``--max-batch-size``)."""
        return cls(
            ds,
            seed=args.seed,
            epochs=args.epochs,
            token_budget=args.token_budget,
            max_batch_size=args.max_batch_size,
            holdout=args.est_holdout,
        )

    @property
    def total(self) -> int:
        return self.starts[-1]

    def locate(self, g: int) -> tuple[int, int]:
        e = bisect_right(self.starts, g) - 1
        return e, g - self.starts[e]

    def epoch_progress(self, g: int) -> float:
        """Epochs done after consuming micro-batches [0, g)."""
        if g >= self.total:
            return float(len(self.epochs))
        e, i = self.locate(g)
        return e + i / len(self.epochs[e])

    def batch(self, g: int) -> MicroBatch:
        e, i = self.locate(g)
        seqs = self.epochs[e][i]
        if len(self.holdout):
            seqs = [*seqs, self.holdout[g % len(self.holdout)]]
        ds = self.ds
        ids, mask, docs, pos = [], [], [], []
        for d, s in enumerate(seqs):
            a, b = int(ds.offsets[s]), int(ds.offsets[s + 1])
            ids.append(ds.tokens[a:b])
            mask.append(ds.mask[a:b])
            docs.append(np.full(b - a, d, dtype=np.int64))
            pos.append(np.arange(b - a, dtype=np.int64))
        return MicroBatch(
            index=g,
            epoch=e,
            input_ids=np.concatenate(ids),
            loss_mask=np.concatenate(mask),
            doc_ids=np.concatenate(docs),
            position_ids=np.concatenate(pos),
        )
