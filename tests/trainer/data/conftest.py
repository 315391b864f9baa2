"""The regeneration tests' real OpenAI-compatible server on 127.0.0.1 (tests/support/openai_server.py): the tiny
target's own generations, one target per module, a fresh server per test."""

from __future__ import annotations

import pytest

from tests.support.openai_server import FaultyServer, TinyTarget


@pytest.fixture(scope="module")
def target(tiny_assets):
    return TinyTarget(str(tiny_assets / "target"))


@pytest.fixture
def server(target):
    with FaultyServer(target) as s:
        yield s
