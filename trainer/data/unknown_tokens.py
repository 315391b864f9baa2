"""The tokenizer's unknown token in ``trainer.prepare``'s output (docs/trainer.md "Preparing data").

A tokenizer that does not fit the text (another model's, a word-level one) turns most of it into its unknown
token (``[UNK]``, ``<unk>``): the drafter then learns to predict it, the training estimate reads high and the
evaluation measures nothing. prepare counts the token ids equal to the tokenizer's ``unk_token_id`` in every
sequence it writes (``"unk"`` on each line, which the trainer ignores and ``--report`` sums) and refuses a share
above ``UNK_LIMIT`` unless ``--allow-unk``: once ``EARLY_TOKENS`` tokens are in (so a wrong tokenizer stops
early), and at the end. A tokenizer without an unknown token (byte-level BPE) never produces one.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.data.chat import PrepareError

UNK_LIMIT = 0.05  # the largest share of unknown tokens prepared without --allow-unk
EARLY_TOKENS = 100_000  # the first check, after this many tokens


@dataclass
class UnknownTokens:
    """Unknown tokens counted over the sequences written; ``limit`` None: never refused (``--allow-unk``)."""

    unk_id: int | None
    name: str | None
    limit: float | None = UNK_LIMIT
    tokens: int = 0
    unk: int = 0
    _early_done: bool = False

    @classmethod
    def of(cls, tok, limit: float | None = UNK_LIMIT) -> UnknownTokens:
        uid = getattr(tok, "unk_token_id", None)
        return cls(uid if isinstance(uid, int) else None, getattr(tok, "unk_token", None), limit)

    def count(self, ids: list[int]) -> int | None:
        """The sequence's unknown tokens (None: the tokenizer has none), added to the totals; checked early."""
        self.tokens += len(ids)
        if self.unk_id is None:
            return None
        n = ids.count(self.unk_id)
        self.unk += n
        if not self._early_done and self.tokens >= EARLY_TOKENS:
            self._early_done = True
            self.check(early=True)
        return n

    @property
    def share(self) -> float:
        return self.unk / self.tokens if self.tokens else 0.0

    def check(self, early: bool = False) -> None:
        if self.limit is None or self.share <= self.limit:
            return
        raise PrepareError(
            f"{self.unk:,} of {'the first ' if early else ''}{self.tokens:,} tokens ({self.share:.1%}) are the "
            f"tokenizer's unknown token {self.name!r}: it does not fit this text (another model's tokenizer?); "
            f"refused above {self.limit:.0%} (--allow-unk prepares anyway); nothing written"
        )

    def stats(self) -> dict:
        return {"unk_token": self.name if self.unk_id is not None else None, "unk_tokens": self.unk,
                "unk_share": round(self.share, 6)}  # fmt: skip
