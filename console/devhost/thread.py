"""Run a :class:`DevHost` on an event loop of its own, in a background thread.

For callers that block (a test that runs the CLI as a subprocess, a synchronous script):
``with DevHostThread(root) as h:`` gives the same attributes as DevHost; ``h.restart()`` and
``h.stop()`` are plain calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from console.devhost.server import DevHost


class DevHostThread:
    def __init__(self, root: str | os.PathLike, **kwargs) -> None:
        self._kwargs = kwargs
        self._root = root
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.host: DevHost | None = None

    def _call(self, coro, timeout: float = 30.0):
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> DevHostThread:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="devhost", daemon=True)
        self._thread.start()

        async def make() -> DevHost:
            return await DevHost(self._root, **self._kwargs).start()

        self.host = self._call(make())
        return self

    def restart(self, pause: float = 0.0) -> None:
        self._call(self.host.restart(pause), timeout=30 + pause)

    def stop(self) -> None:
        """Stop the server and its session processes, then end the thread."""
        if self._loop is None:
            return
        try:
            self._call(self.host.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._loop = None

    def __enter__(self) -> DevHostThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # DevHost's attributes, read through.
    def __getattr__(self, name: str):
        host = self.__dict__.get("host")
        if host is None:
            raise AttributeError(name)
        return getattr(host, name)

    def add_container(self, ct: int) -> Path:
        return self.host.add_container(ct)
