"""``python -m trainer.tiny OUT``: the tiny offline target, chat file and data set of the demo and tests
(``trainer.data.tiny_build``; docs/trainer.md)."""

import sys

from trainer.data.tiny_build import main

if __name__ == "__main__":
    sys.exit(main())
