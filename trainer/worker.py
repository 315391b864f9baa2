"""``python -m trainer.worker FLAGS``: one target or drafter worker of the multi-process pipeline, started by
the launcher (one per device) or by torchrun; the worker itself is ``trainer.runtime.device_worker``."""

from trainer.runtime.device_worker import main

if __name__ == "__main__":
    main()
