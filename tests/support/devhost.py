"""The devhost (console/devhost: an SSH server on 127.0.0.1 with a ``pct`` stand-in) for tests, set up one way.

``devhost_thread(root, *containers, **kw)`` (blocking callers) and ``devhost_async(root, *containers, **kw)``
(an async test's own loop) start a host at ``root`` with the containers named (``CT`` when none are), ``kw``
going to :class:`DevHost` (``env=``, ``python=``, ``port=``); ``env`` may be a function of the host's root
(``env=no_pyspy_env``: a PATH that names the host's own bin folder). ``devhost_fixture(...)`` makes a fixture of it,
named by what the module assigns it to::

    host = devhost_fixture(scope="module")  # one host for the module, container CT
    host = devhost_fixture(asynchronous=True)  # a DevHost on the test's loop, one per test

``devhost`` (per test) and ``devhost_module`` (per module) are registered for every test (tests/conftest.py).
The whole environment, OMP_NUM_THREADS=1 included, is inherited from the tests' (tests/conftest.py sets it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from console.devhost import DevHost, DevHostThread
from tests.support.core_util import CT


def _kw(root: str | os.PathLike, kw: dict) -> dict:
    env = kw.get("env")
    return {**kw, "env": env(Path(root).resolve())} if callable(env) else kw


@contextmanager
def devhost_thread(root: str | os.PathLike, *containers: int, **kw) -> Iterator[DevHostThread]:
    """A :class:`DevHostThread` at ``root`` holding ``containers`` (``CT`` when none), stopped on exit."""
    with DevHostThread(root, **_kw(root, kw)) as h:
        for ct in containers or (CT,):
            h.add_container(ct)
        yield h


@asynccontextmanager
async def devhost_async(root: str | os.PathLike, *containers: int, **kw) -> AsyncIterator[DevHost]:
    """A :class:`DevHost` on the running loop at ``root`` holding ``containers`` (``CT`` when none)."""
    async with DevHost(root, **_kw(root, kw)) as h:
        for ct in containers or (CT,):
            h.add_container(ct)
        yield h


def devhost_fixture(*containers: int, scope: str = "function", asynchronous: bool = False, **kw):
    """A fixture giving a devhost with ``containers`` (``CT`` when none) and DevHost's ``kw``; its root is
    ``tmp_path/"devhost"`` for a per-test one, a fresh ``devhost*`` folder otherwise."""
    if asynchronous:
        if scope != "function":
            raise ValueError("an async devhost lives on one test's loop: scope='function' only")

        async def make_async(tmp_path):
            async with devhost_async(tmp_path / "devhost", *containers, **kw) as h:
                yield h

        return pytest.fixture(make_async)

    def make(request):
        if scope == "function":
            root = request.getfixturevalue("tmp_path") / "devhost"
        else:
            root = request.getfixturevalue("tmp_path_factory").mktemp("devhost")
        with devhost_thread(root, *containers, **kw) as h:
            yield h

    return pytest.fixture(make, scope=scope)


devhost = devhost_fixture()
devhost_module = devhost_fixture(scope="module")
