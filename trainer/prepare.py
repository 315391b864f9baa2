"""``python -m trainer.prepare``: chat / prompt-completion / text JSONL to the trainer's tokenized format
(``trainer.data.tokenizing``; docs/trainer.md)."""

import sys

from trainer.data.tokenizing import main

if __name__ == "__main__":
    sys.exit(main())
