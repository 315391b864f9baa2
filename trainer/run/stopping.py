"""SIGINT/SIGTERM handling for the stop protocol (docs/run-directory.md).

The signal handler only records the signal (``SimpleQueue.put`` is reentrant) and sets ``requested``;
``drain()``, called from the reporter thread every 0.1 s and by the training loop before it saves,
turns records into the ``stop_requested`` event (first signal) or a log line (later ones: while a
checkpoint is being written they are ignored until it ends; SIGKILL is the only way to abort a save).
"""

from __future__ import annotations

import queue
import signal
import threading


class StopControl:
    def __init__(self):
        self.requested = False
        self.saving = False
        self.signal_name: str | None = None
        self.writer = None  # MetricsWriter, once the run directory is open
        self._pending: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._announced = False

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self._handler)

    def _handler(self, signum, _frame) -> None:
        self.requested = True
        self._pending.put(signum)

    def drain(self) -> None:
        with self._lock:
            while True:
                try:
                    signum = self._pending.get_nowait()
                except queue.Empty:
                    break
                name = signal.Signals(signum).name
                if self.signal_name is None:
                    self.signal_name = name  # the stop request itself, announced below
                elif self.saving:
                    print(
                        f"{name} received while a checkpoint is being written: ignored until the save ends",
                        flush=True,
                    )
                else:
                    print(f"{name} received again: already stopping", flush=True)
            if self.signal_name is not None and not self._announced and self.writer is not None:
                self._announced = True
                print(
                    f"{self.signal_name} received: stopping after the current step and saving a checkpoint",
                    flush=True,
                )
                self.writer.event("stop_requested", signal=self.signal_name)
