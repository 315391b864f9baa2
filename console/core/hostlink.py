"""One SSH connection per host, shared by the sessions of its containers (one helper each).

A :class:`HostLink` hands the live connection to every session that asks (``acquire``) and counts
them; the last ``release`` closes it. When the link drops, every session's helper ends, each
session tears down and reconnects by itself; the first to ask opens a new connection (host keys
checked as for one session: ``ssh.connect``) and the others get that one. ``HostLinks`` keeps one
link per distinct set of connection options.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import astuple

import asyncssh

from console.core.options import ConnectOptions
from console.core.ssh import connect


class HostLink:
    def __init__(self, options: ConnectOptions) -> None:
        self.options = options
        self.conn: asyncssh.SSHClientConnection | None = None
        self.users: dict[int, int] = {}  # id(conn) -> sessions holding it
        self.opened = 0  # connections opened so far (tests)
        self._lock = asyncio.Lock()
        self._dead: set[int] = set()

    def _alive(self, conn) -> bool:
        return conn is not None and id(conn) not in self._dead and not conn.is_closed()

    async def acquire(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if not self._alive(self.conn):
                conn = await connect(self.options)
                self.opened += 1
                self.conn = conn
                asyncio.get_running_loop().create_task(self._watch(conn))
            self.users[id(self.conn)] = self.users.get(id(self.conn), 0) + 1
            return self.conn

    async def _watch(self, conn) -> None:
        with contextlib.suppress(Exception):
            await conn.wait_closed()
        self._dead.add(id(conn))
        if self.conn is conn:
            self.conn = None

    def release(self, conn) -> None:
        n = self.users.get(id(conn), 0) - 1
        if n > 0:
            self.users[id(conn)] = n
            return
        self.users.pop(id(conn), None)
        if self.conn is conn:
            self.conn = None
        conn.close()


class HostLinks:
    """One :class:`HostLink` per distinct connection options (user, host, port, key, jump...)."""

    def __init__(self) -> None:
        self.links: dict[tuple, HostLink] = {}

    def get(self, options: ConnectOptions) -> HostLink:
        key = repr(astuple(options))
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = HostLink(options)
        return link
