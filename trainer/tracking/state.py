"""RUN_DIR/tracking.json: which run of each tracker this run directory writes to, so that a resumed trainer
(``--resume`` finding a checkpoint) continues the same run in each (docs/run-directory.md).

``{"wandb": {"id": ...}, "mlflow": {"run_id": ..., "tracking_uri": ...}, "tensorboard": {"log_dir": ...}}``,
replaced atomically on every change (rundir.atomic_write_text). Read bounded and distrustfully: a file that is
not a regular file (a symlink is not followed), over 64 KiB, or not a JSON object of objects reads as empty,
with the reason in ``problem``.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any

from trainer.run.rundir import atomic_write_text

FILE = "tracking.json"
MAX_BYTES = 64 * 1024


class State:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, FILE)
        self._lock = threading.Lock()
        self.problem: str | None = None
        self.data = self._read()

    def get(self, tracker: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self.data.get(tracker)
            return dict(entry) if isinstance(entry, dict) else None

    def put(self, tracker: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self.data[tracker] = dict(entry)
            atomic_write_text(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")

    def _read(self) -> dict[str, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return {}
        except OSError as e:
            self.problem = f"cannot open {self.path}: {e}"
            return {}
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                self.problem = f"{self.path} is not a regular file of at most {MAX_BYTES} bytes"
                return {}
            with os.fdopen(fd, "rb") as f:
                fd = -1
                data = json.loads(f.read(MAX_BYTES))
        except (OSError, ValueError, RecursionError) as e:
            self.problem = f"cannot read {self.path}: {e}"
            return {}
        finally:
            if fd >= 0:
                os.close(fd)
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            self.problem = f"{self.path} is not a JSON object of objects"
            return {}
        return data
