"""Poll a serving endpoint's ``/metrics`` through the helper (console/core/serving.py): one sample, or a
:class:`ServedState` every ``SERVE_POLL_S`` over a sliding window, for the screen and ``serve-status``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from console.core.events import ServedState
from console.core.helper import Helper, HelperError, HelperGone
from console.core.sanitize import clean_text
from console.core.serving import Counters, Endpoint, Window, parse_metrics, served

SERVE_POLL_S = 10.0
SERVE_WINDOW_S = 60.0
HTTP_TIMEOUT_S = 8.0


class ServeError(Exception):
    """The endpoint could not be read (not listening, not a metrics page, an error status)."""


async def sample(helper: Helper, endpoint: Endpoint, clock: Callable[[], float] = time.time) -> Counters:
    """One reading of ``endpoint``'s counters (ServeError when there is none to read)."""
    try:
        r = await helper.call(
            "http_get", host=endpoint.host, port=endpoint.port, path=endpoint.path, timeout=HTTP_TIMEOUT_S
        )
    except HelperGone:
        raise
    except HelperError as e:
        raise ServeError(f"{endpoint}: {clean_text(str(e))[:200]}") from None
    if r.get("status") != 200:
        raise ServeError(f"{endpoint}: {endpoint.path} answered HTTP {r.get('status')}")
    return parse_metrics(str(r.get("body") or ""), clock())


async def watch(
    helper: Helper, endpoint: Endpoint, emit: Callable[[object], None], closing: Callable[[], bool]
) -> None:
    """Emit the served figure every :data:`SERVE_POLL_S` until the helper goes or the session closes."""
    window = Window(SERVE_WINDOW_S)
    with contextlib.suppress(HelperGone, asyncio.CancelledError):
        while not helper.closed and not closing():
            try:
                window.add(await sample(helper, endpoint))
                emit(ServedState.of(str(endpoint), served(endpoint.kind, window.samples)))
            except ServeError as e:
                emit(ServedState(str(endpoint), error=str(e), t=time.time()))
            await asyncio.sleep(SERVE_POLL_S)
