"""The launcher's control channel to its workers: JSON objects, one a line, over a TCP socket.

The launcher listens (``Server``; 127.0.0.1 unless ``--control-host`` says otherwise); each worker
connects (``connect``), says ``hello`` and then sends meter readings, metrics records and its result;
the launcher sends ``welcome``, ``stop``, ``exit`` and ``abort``. Every message is ``{"op": ..., ...}``.
A worker whose connection ends takes it as the launcher's death and exits.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time


class Channel:
    """One connection; ``send`` is thread-safe, iteration yields received messages until EOF."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._rf = sock.makefile("rb")
        self._lock = threading.Lock()
        self.closed = False

    def send(self, op: str, **fields) -> bool:
        line = (json.dumps({"op": op, **fields}) + "\n").encode()
        with self._lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(line)
                return True
            except OSError:
                self.closed = True
                return False

    def __iter__(self):
        while True:
            try:
                line = self._rf.readline()
            except (OSError, ValueError):
                return
            if not line:
                return
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                if isinstance(msg, dict):
                    yield msg

    def close(self) -> None:
        with self._lock:
            self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(address: str, timeout: float = 120.0) -> Channel:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Channel(sock)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Server:
    """Accepts worker connections; every message lands in ``inbox`` as ``(conn_id, msg)``, EOF as
    ``(conn_id, {"op": "eof"})``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(256)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.inbox: queue.Queue = queue.Queue()
        self.channels: dict[int, Channel] = {}
        self._n = 0
        threading.Thread(target=self._accept, name="dflash-control-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid, self._n = self._n, self._n + 1
            ch = Channel(sock)
            self.channels[cid] = ch
            threading.Thread(
                target=self._read, args=(cid, ch), name=f"dflash-control-{cid}", daemon=True
            ).start()

    def _read(self, cid: int, ch: Channel) -> None:
        for msg in ch:
            self.inbox.put((cid, msg))
        self.inbox.put((cid, {"op": "eof"}))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for ch in list(self.channels.values()):
            ch.close()
