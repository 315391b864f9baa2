"""``python -m trainer.worker FLAGS``: one target or drafter worker of the multi-process pipeline, started by
the launcher (one per device) or by torchrun; the worker itself is ``trainer.runtime.worker``."""

from trainer.runtime.worker import main

if __name__ == "__main__":
    main()
