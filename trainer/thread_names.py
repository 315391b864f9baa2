"""OS names for the trainer's threads, so that ``top -H``, ``ps -L``, py-spy and the console's threads
view (``t``) tell them apart.

Python (before 3.14) keeps ``threading.Thread``'s name to itself: the OS name (``/proc/PID/task/TID/comm``)
of every thread is the one it inherited from the thread that started it, usually the interpreter's
(``python3``). On Linux, ``prctl(PR_SET_NAME)`` names the calling thread; the kernel keeps 15 bytes. A
longer name loses its ``dflash-`` prefix first, then its end (at a character boundary). Elsewhere
(macOS, Windows) every call here does nothing.

- :func:`name_this_thread` names the calling thread (its Python name by default): the first line of a
  ``Thread`` subclass's ``run``, or the main thread of a process (``dflash-launch``, ``dflash-target0``);
- :func:`named` wraps a thread's ``target`` so that the thread names itself before it runs:
  ``threading.Thread(target=named(fn), name="dflash-meter")``.

A thread started after a rename inherits the new name until it names itself (so do the native threads
torch starts).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15
LIMIT = 15  # bytes the kernel keeps (TASK_COMM_LEN 16, with the NUL)
PREFIX = "dflash-"

_prctl: Any = None  # libc's prctl once looked up; False where there is none


def os_name(name: str) -> bytes:
    """``name`` as the kernel will keep it: at most 15 bytes of UTF-8, no NUL."""
    name = name.replace("\0", "")
    if len(name.encode()) > LIMIT and name.startswith(PREFIX):
        name = name[len(PREFIX) :]
    data = name.encode()[:LIMIT]
    return data.decode("utf-8", "ignore").encode()  # a character cut in half is dropped


def _libc_prctl():
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else False
        except (OSError, AttributeError):
            _prctl = False
    return _prctl


def name_this_thread(name: str | None = None) -> bool:
    """Give the calling thread the OS name ``name`` (default: its Python name); True when it was set."""
    prctl = _libc_prctl()
    if not prctl:
        return False
    data = os_name(name if name is not None else threading.current_thread().name)
    if not data:
        return False
    return prctl(PR_SET_NAME, ctypes.c_char_p(data), 0, 0, 0) == 0


def named(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for a thread's ``target``: the thread first takes its Python name as its OS name."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        name_this_thread()
        return fn(*args, **kwargs)

    return run
