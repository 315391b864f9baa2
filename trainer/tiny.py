"""``python -m trainer.tiny OUT``: the tiny offline target, chat file and data set of the demo and tests
(``trainer.data.tiny``; docs/trainer.md)."""

import sys

from trainer.data.tiny import main

if __name__ == "__main__":
    sys.exit(main())
