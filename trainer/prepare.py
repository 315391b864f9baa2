"""``python -m trainer.prepare``: chat / prompt-completion / text JSONL to the trainer's tokenized format
(``trainer.data.prepare``; docs/trainer.md)."""

import sys

from trainer.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
