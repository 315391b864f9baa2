"""``python -m trainer.regenerate``: the target writes the responses of a prompt file, from an
OpenAI-compatible server or in process, resumable (``trainer.regeneration``; docs/trainer.md)."""

import sys

from trainer.regeneration.command import main

if __name__ == "__main__":
    sys.exit(main())
