"""``Background(fn, name)``: ``fn`` in a daemon thread, started at once; ``result()`` joins it and returns
what ``fn`` returned or raises what it raised. Start-up work that can overlap other start-up work (the
target's load beside the drafter's build and resume; the optimizer state beside the first step's compile)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from trainer.thread_names import named


class Background:
    def __init__(self, fn: Callable[[], Any], name: str):
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=named(self._run), args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that asks for the result
            self._error = e

    def wait(self) -> None:
        """Until ``fn`` has returned or raised (what it raised stays for ``result``)."""
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
