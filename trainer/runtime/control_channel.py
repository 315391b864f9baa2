"""The launcher's control channel to its workers: JSON objects, one a line, over a TCP socket.

The launcher listens (``Server``; 127.0.0.1 unless ``--control-host`` says otherwise); each worker
connects (``connect``), says ``hello`` and then sends meter readings, metrics records and its result;
the launcher sends ``welcome``, ``stop``, ``exit`` and ``abort``. Every message is ``{"op": ..., ...}``.
A worker whose connection ends takes it as the launcher's death and exits.

Every connection authenticates first, both ways, with the launch's secret (``new_secret``: 32 random
bytes, hex; the launcher's workers get it in ``DFLASH_CONTROL_SECRET``, torchrun's read it there or from
``RUN/control.secret``, mode 0600, ``write_secret_file``): the launcher sends ``{"op": "challenge",
"nonce"}``, the worker answers ``{"op": "auth", "mac": HMAC-SHA256(secret, "worker" nonce), "nonce": its
own}``, the launcher proves itself with ``{"op": "authok", "mac": HMAC(secret, "launcher" its nonce)}``.
The secret never crosses the wire. A peer that does not finish its handshake within ``AUTH_TIMEOUT_S`` (a
deadline over all its bytes: trickling them does not extend it) or answers wrong is dropped before anything it
sends is read as a message, and logged once (``Server.log``); the run goes on. The accept loop never waits on a
peer and never turns a newcomer away: past ``HANDSHAKES_MAX`` handshakes at once, or ``PER_SOURCE_MAX`` from one
address, the oldest pending one (of that address) is dropped to make room, so a worker, which answers at once,
gets through peers that hold connections open; a worker whose handshake is cut before the challenge retries.
After that the channel is neither encrypted nor signed per message: across hosts (``--launch torchrun``)
it is as private as the network between them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import sys
import threading
import time

from trainer.thread_names import named

SECRET_ENV = "DFLASH_CONTROL_SECRET"
SECRET_FILE = "control.secret"  # in the run directory, mode 0600: for torchrun's workers
AUTH_TIMEOUT_S = 10.0
AUTH_LINE_MAX = 4096  # bytes of a handshake line; a longer one is a failed handshake
HANDSHAKES_MAX = 64  # handshakes under way at once; past them the oldest pending one is dropped
PER_SOURCE_MAX = 16  # handshakes under way from one source address; past them its oldest is dropped
DROP_LOG_MAX = 20  # dropped peers logged one line each; after that one line says further ones are not


class AuthError(ConnectionError):
    """The other end of a control connection did not authenticate."""


def new_secret() -> str:
    return secrets.token_hex(32)


def write_secret_file(run_dir: str, secret: str) -> str:
    """``RUN/control.secret`` (0600, created afresh: never through a planted link), for torchrun's workers."""
    path = os.path.join(run_dir, SECRET_FILE)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secret + "\n")
    return path


def worker_secret(run_dir: str) -> str:
    """A worker's secret: ``DFLASH_CONTROL_SECRET`` (taken out of the environment: not for its children),
    else the run directory's ``control.secret``."""
    got = os.environ.pop(SECRET_ENV, "").strip()
    if got:
        return got
    path = os.path.join(run_dir, SECRET_FILE)
    try:
        with open(path, encoding="ascii") as f:
            got = f.read(200).strip()
    except (OSError, ValueError) as e:
        raise AuthError(
            f"no control secret: {SECRET_ENV} is not set and {path} is unreadable ({e}); set {SECRET_ENV} "
            f"to the content of the launcher's {SECRET_FILE} (docs/trainer.md)"
        ) from None
    if not got:
        raise AuthError(f"no control secret: {path} is empty")
    return got


def _cut(sock: socket.socket) -> None:
    """End a handshake now: its blocked read returns."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class deadline:  # noqa: N801 - used as a function
    """A handshake's deadline over all its bytes: ``sock`` is shut down after ``seconds`` unless ``cancel()`` came
    first (a handshake that finished in time is never cut after the fact)."""

    def __init__(self, sock: socket.socket, seconds: float):
        self._lock, self._over, self.fired = threading.Lock(), False, False
        self._t = threading.Timer(seconds, self._fire, (sock,))
        self._t.daemon = True
        self._t.start()

    def _fire(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._over:
                self._over = self.fired = True
                _cut(sock)

    def cancel(self) -> None:
        with self._lock:
            self._over = True
        self._t.cancel()


def _mac(secret: str, who: bytes, nonce: str) -> str:
    return hmac.new(secret.encode(), who + nonce.encode(), hashlib.sha256).hexdigest()


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

    def read_one(self, limit: int = AUTH_LINE_MAX) -> dict:
        """One message of a handshake: a JSON object on one line of at most ``limit`` bytes, or AuthError."""
        try:
            line = self._rf.readline(limit + 1)
        except (OSError, ValueError) as e:
            raise AuthError(f"no answer ({type(e).__name__})") from None
        if not line.endswith(b"\n"):
            raise AuthError("the connection ended" if not line else f"a line over {limit} bytes")
        try:
            msg = json.loads(line)
        except ValueError:
            raise AuthError("not a JSON line") from None
        if not isinstance(msg, dict):
            raise AuthError("not a JSON object")
        return msg

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


def connect(address: str, secret: str, timeout: float = 120.0) -> Channel:
    """A channel to the launcher at ``host:port``, authenticated both ways (AuthError where it fails)."""
    host, _, port = address.rpartition(":")
    end = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
            continue
        ch = Channel(sock)
        timer = deadline(sock, AUTH_TIMEOUT_S)
        try:
            challenge = ch.read_one()
        except AuthError:  # cut before the challenge (the launcher made room for newer peers): again
            timer.cancel()
            ch.close()
            if time.monotonic() > end:
                raise AuthError(f"control socket {address}: no challenge from the launcher") from None
            time.sleep(0.05)
            continue
        break
    try:
        mine = secrets.token_hex(16)
        ch.send("auth", mac=_mac(secret, b"worker", str(challenge.get("nonce", ""))), nonce=mine)
        try:
            proof = ch.read_one()
        except AuthError as e:
            raise AuthError(
                f"the launcher refused this worker's answer ({e}): another secret than its own?"
            ) from None
        if proof.get("op") != "authok" or not hmac.compare_digest(
            str(proof.get("mac", "")), _mac(secret, b"launcher", mine)
        ):
            raise AuthError(
                "the launcher did not prove it holds the secret (another secret, or not the launcher)"
            )
        sock.settimeout(None)
    except (AuthError, OSError) as e:
        ch.close()
        raise AuthError(f"control socket {address}: {e}") from None
    finally:
        timer.cancel()
    return ch


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Server:
    """Accepts worker connections that authenticate with ``secret``; every message of those lands in
    ``inbox`` as ``(conn_id, msg)``, EOF as ``(conn_id, {"op": "eof"})``. Others are dropped and logged
    (``log``) once each, the first ``DROP_LOG_MAX``; ``dropped`` counts them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, secret: str, log=_stderr):
        self.secret, self.log = secret, log
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(256)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.inbox: queue.Queue = queue.Queue()
        self.channels: dict[int, Channel] = {}
        self.dropped = 0
        self._n = 0
        self._lock = threading.Lock()
        self._pending: dict[
            socket.socket, str
        ] = {}  # handshakes under way (oldest first): their source address
        threading.Thread(target=named(self._accept), name="dflash-control-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.sock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._make_room(peer[0] if isinstance(peer, tuple) else str(peer))
            with self._lock:
                self._pending[sock] = peer[0] if isinstance(peer, tuple) else str(peer)
            # the handshake in the connection's own thread: a silent peer holds up no other
            threading.Thread(
                target=named(self._serve), args=(sock, peer), name="dflash-control", daemon=True
            ).start()

    def _make_room(self, source: str) -> None:
        """Past the caps, the oldest pending handshake (of ``source`` where its own cap is reached) is cut: its
        thread drops it. A newcomer is never turned away, so peers that hold connections open starve nobody."""
        with self._lock:
            mine = [s for s, src in self._pending.items() if src == source]
            if len(mine) >= PER_SOURCE_MAX:
                victim = mine[0]
            elif len(self._pending) >= HANDSHAKES_MAX:
                victim = next(iter(self._pending))
            else:
                return
            del self._pending[victim]
        _cut(victim)

    def _authenticate(self, sock: socket.socket, ch: Channel) -> None:
        sock.settimeout(AUTH_TIMEOUT_S)
        nonce = secrets.token_hex(16)
        if not ch.send("challenge", nonce=nonce):
            raise AuthError("the connection ended")
        answer = ch.read_one()
        if answer.get("op") != "auth":
            raise AuthError(
                f"its first message was not an answer to the challenge (op {str(answer.get('op'))[:40]!r})"
            )
        if not hmac.compare_digest(str(answer.get("mac", "")), _mac(self.secret, b"worker", nonce)):
            raise AuthError("a wrong answer to the challenge")
        ch.send("authok", mac=_mac(self.secret, b"launcher", str(answer.get("nonce", ""))[:200]))
        sock.settimeout(None)

    def _serve(self, sock: socket.socket, peer) -> None:
        ch = Channel(sock)
        timer = deadline(sock, AUTH_TIMEOUT_S)
        try:
            self._authenticate(sock, ch)
        except (AuthError, OSError) as e:
            ch.close()
            late = AuthError(f"no answer within {AUTH_TIMEOUT_S:g} s, a deadline over all its bytes")
            self._dropped(peer, late if timer.fired else e)
            return
        finally:
            timer.cancel()
            with self._lock:
                self._pending.pop(sock, None)
        with self._lock:
            cid, self._n = self._n, self._n + 1
        self.channels[cid] = ch
        self._read(cid, ch)

    def _dropped(self, peer, e: Exception) -> None:
        with self._lock:
            self.dropped += 1
            n = self.dropped
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        if n <= DROP_LOG_MAX:
            self.log(
                f"warning: control socket: dropped a connection from {where} that did not authenticate "
                f"({e}); nothing it sent was used, the run goes on"
            )
        if n == DROP_LOG_MAX:
            self.log(f"warning: control socket: {n} connections dropped; further ones are not logged")

    def _read(self, cid: int, ch: Channel) -> None:
        for msg in ch:
            self.inbox.put((cid, msg))
        self.inbox.put((cid, {"op": "eof"}))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for ch in list(self.channels.values()):
            ch.close()
