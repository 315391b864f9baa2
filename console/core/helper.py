"""Client of the remote helper (console/core/helper_program/) over one SSH exec channel.

``Helper.start(conn, place=...)`` runs a short bootstrap, ``python3 -c 'import sys;exec(...read(N)...)'
dflash-console-helper``, where the trainer lives (the host, or a container through its exec prefix:
console/core/place.py), quoted with shlex.join, and sends the program (N bytes) on its stdin: the
program's text is in no process's command line (``ps``, ``pgrep -f trainer.pipeline`` never list the
helper). It waits for the hello, then multiplexes requests by id: ``await helper.call(op, **args)`` for one
answer, ``helper.stream(op, on_push, **args)`` for a request that pushes data until cancelled.
When the channel closes every pending call fails with :class:`HelperGone`; a call not answered within its
limit (:func:`call_limit`) fails with :class:`HelperTimeout`, naming the request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import itertools
import json
import re
import shlex
from collections.abc import Callable

import asyncssh

from console.core.helper_program import program_text
from console.core.place import HOST, Place
from console.core.sanitize import clean_text, loads


class HelperError(Exception):
    """The helper ran the request and it failed remotely (``kind`` is the remote exception name)."""

    def __init__(self, message: str, kind: str = "Error") -> None:
        super().__init__(message)
        self.kind = kind


class HelperTimeout(HelperError):
    """The helper did not answer a request within its limit (a stalled file system, a stuck process)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "HelperTimeout")


CALL_S = 30.0  # one file, one directory listing or one /proc entry
MAX_LINE = 16 << 20  # bytes of one reply line read at most (the helper answers at most 8 MiB: MAX_REPLY)
LONG_CALL_S = 600.0  # a walk, a checksum, a deploy's files, a command without its own timeout
MARGIN_S = 30.0  # beyond an op's own remote ``timeout``
LONG_OPS = frozenset({"checkpoints", "tree", "sha256", "write_files", "rmtree", "scan", "find", "spawn"})
CANCELLABLE = frozenset({"wait_exit", "follow"})


def call_limit(op: str, args: dict) -> float | None:
    """How long :meth:`Helper.call` waits for ``op``: every request is bounded, except a ``wait_exit``
    without a ``timeout`` (a wait for a trainer's exit: its caller holds the deadline and cancels it)."""
    remote = args.get("timeout")
    if op in ("run", "wait_exit") and isinstance(remote, (int, float)):
        return float(remote) + MARGIN_S
    if op == "wait_exit":
        return None
    return LONG_CALL_S if op in LONG_OPS or op == "run" else CALL_S


def _what(op: str, args: dict) -> str:
    """The request as an error names it: ``read /path``, ``run nvidia-smi``, ``kill pid 42``."""
    if "path" in args:
        return f"{op} {args['path']}"
    if op == "run" and args.get("argv"):
        return f"run {shlex.join(str(a) for a in args['argv'])[:120]}"
    if "pid" in args:
        return f"{op} pid {args['pid']}"
    return op


class HelperGone(ConnectionError):
    """The helper's channel closed (link dropped, helper exited)."""


class HelperStartError(RuntimeError):
    """The helper did not come up (no python3, no such container, ...)."""


class PlaceUnreachable(HelperStartError):
    """The command that starts the helper ended before the helper spoke: no such container, pod or job, the
    runtime's program missing on the host, no python3 there. The message names the command tried."""


HELPER_NAME = "dflash-console-helper"  # its command line's last word (and, cut to 15 bytes, its comm)


@functools.cache
def program_bytes() -> bytes:
    return program_text().encode("utf-8")


def bootstrap_argv(python: str = "python3") -> list[str]:
    """What starts the helper: read exactly the program's bytes from stdin and run them (the requests
    follow on the same stdin, after the hello); it names no trainer, only the helper."""
    size = len(program_bytes())
    code = f"import sys;exec(compile(sys.stdin.buffer.read({size}),{HELPER_NAME!r},'exec'))"
    return [python, "-c", code, HELPER_NAME]


def helper_command(place: Place, python: str = "python3") -> str:
    """The remote command line that starts the helper in ``place``, quoted from an argument list (its
    program follows on stdin: :meth:`Helper.start`)."""
    return place.command(bootstrap_argv(python))


def b64decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _read_hello(process: asyncssh.SSHClientProcess, place: Place, python: str) -> dict:
    junk: list[bytes] = []
    while True:
        line = await process.stdout.readline()
        if not line:
            err = b""
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(process.stderr.read(), 2)
            text = clean_text((err or b"".join(junk)).decode("utf-8", "replace").strip())
            said = "; ".join(ln.strip() for ln in text.splitlines() if ln.strip())[:600] or "no output"
            tried = place.command([python, "-c", "<helper bootstrap>", HELPER_NAME])
            raise PlaceUnreachable(f"could not start the helper on {place.describe}: {said} (ran: {tried})")
        try:
            msg = json.loads(line)
        except ValueError:
            junk.append(line)  # e.g. a login banner; skip until the hello
            continue
        if isinstance(msg, dict) and msg.get("hello") == "dflash-console-helper":
            return msg
        junk.append(line)


class Stream:
    """A streaming request in flight; ``done`` resolves with its final result."""

    def __init__(self, helper: Helper, rid: int, on_push: Callable[[dict], None]) -> None:
        self.helper = helper
        self.id = rid
        self.on_push = on_push
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def cancel(self) -> None:
        if self.done.done():
            return
        with contextlib.suppress(HelperGone, HelperError):
            await self.helper.call("cancel", target=self.id)


class Helper:
    """One running helper. Use :meth:`start`; :meth:`close` ends it (it exits on stdin EOF)."""

    def __init__(self, process: asyncssh.SSHClientProcess, hello: dict) -> None:
        self._process = process
        self.hello = hello
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._whats: dict[int, str] = {}  # rid -> the request as an error names it (_what)
        self._streams: dict[int, Stream] = {}
        self._closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def start(
        cls,
        conn: asyncssh.SSHClientConnection,
        *,
        place: Place = HOST,
        python: str = "python3",
        timeout: float = 30.0,
    ) -> Helper:
        process = await conn.create_process(helper_command(place, python), encoding=None)
        with contextlib.suppress(asyncssh.Error, OSError):  # a place that did not start says why below
            process.stdin.write(program_bytes())
        try:
            hello = await asyncio.wait_for(_read_hello(process, place, python), timeout)
        except asyncio.TimeoutError as e:
            process.close()
            raise HelperStartError(f"the helper did not answer within {timeout:.0f} s") from e
        except BaseException:
            process.close()
            raise
        return cls(process, hello)

    @property
    def pid(self) -> int:
        return int(self.hello["pid"])

    @property
    def home(self) -> str:
        return str(self.hello["home"])

    @property
    def closed(self) -> bool:
        return self._closed.done()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    async def _read_line(self) -> tuple[bytes, int]:
        """(one whole line, its size): asyncssh hands a line longer than its buffer (~2 MB) over in
        parts, joined here up to :data:`MAX_LINE`; a longer one is dropped, and only its first bytes
        (where its id is) come back. (b"", 0) at EOF."""
        parts: list[bytes] | None = []
        head, size = b"", 0
        while True:
            part = await self._process.stdout.readline()
            if not part:
                break
            head = head or part[:64]
            size += len(part)
            if parts is not None and size <= MAX_LINE:
                parts.append(part)
            else:
                parts = None
            if part.endswith(b"\n"):
                break
        return (b"".join(parts) if parts is not None else head), size

    def _too_long(self, head: bytes, size: int) -> None:
        """A reply over MAX_LINE: its request fails, saying so (it is not left waiting on its limit)."""
        m = re.match(rb'\{"id":(\d+)', head)
        rid = int(m.group(1)) if m else None
        self._fail(rid, f"{size / 2**20:.1f} MiB long, over the console's limit of {MAX_LINE >> 20} MiB")

    def _fail(self, rid: int | None, why: str) -> None:
        fut = self._pending.pop(rid, None)
        st = self._streams.pop(rid, None)
        target = fut if fut is not None else (st.done if st is not None else None)
        what = self._whats.pop(rid, None) or "a request"
        if target is not None and not target.done():
            target.set_exception(
                HelperError(f"the helper's answer to `{what}` was not read: it is {why}", "ReplyTooLong")
            )

    async def _read_loop(self) -> None:
        reason = "helper channel closed"
        try:
            while True:
                line, size = await self._read_line()
                if not line:
                    break
                if size > MAX_LINE:
                    self._too_long(line, size)
                    continue
                try:  # bounded, and every string cleaned: what any caller gets is safe to show
                    msg = loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict):  # valid JSON but no reply (a stray line): skipped
                    continue
                rid = msg.get("id")
                if "push" in msg:
                    st = self._streams.get(rid)
                    if st is not None:
                        try:
                            st.on_push(msg["push"])
                        except Exception:  # a consumer bug must not kill the channel
                            import logging

                            logging.getLogger(__name__).exception("stream consumer failed")
                    continue
                if msg.get("kind") == "ReplyTooLong":  # the helper's own limit (framing.MAX_REPLY)
                    self._fail(rid, str(msg.get("error", "too long")))
                    continue
                fut = self._pending.pop(rid, None)
                st = self._streams.pop(rid, None)
                self._whats.pop(rid, None)
                target = fut if fut is not None else (st.done if st is not None else None)
                if target is None or target.done():
                    continue
                if msg.get("ok"):
                    target.set_result(msg.get("result"))
                else:
                    target.set_exception(HelperError(msg.get("error", "?"), msg.get("kind", "Error")))
        except (asyncssh.Error, OSError) as e:
            reason = f"helper channel lost: {e}"
        finally:
            gone = HelperGone(reason)
            for fut in list(self._pending.values()) + [s.done for s in self._streams.values()]:
                if not fut.done():
                    fut.set_exception(gone)
                    fut.exception()  # mark retrieved: nobody may be awaiting a cancelled stream
            self._pending.clear()
            self._streams.clear()
            if not self._closed.done():
                self._closed.set_result(None)

    def _send(self, obj: dict) -> None:
        if self.closed:
            raise HelperGone("helper channel closed")
        try:
            self._process.stdin.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        except (asyncssh.Error, OSError, BrokenPipeError) as e:
            raise HelperGone(f"helper channel lost: {e}") from e

    async def call(self, op: str, *, wait_s: float | None = None, **args) -> object:
        """Send one request and return its result (raises HelperError / HelperGone / HelperTimeout).

        ``wait_s`` bounds the wait here (default :func:`call_limit`); the op's own arguments (``timeout``
        of ``run``) go remote. A request given up (timed out, or its awaiting task cancelled) that the
        helper can cancel (``wait_exit``) is cancelled there too.
        """
        if op == "run" and args.get("timeout") is None:
            args["timeout"] = LONG_CALL_S  # the command is killed remotely, not only waited for here
        limit = wait_s if wait_s is not None else call_limit(op, args)
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._whats[rid] = _what(op, args)
        try:
            self._send({"id": rid, "op": op, **args})
        except HelperGone:
            self._pending.pop(rid, None)
            raise
        try:
            # asyncio.wait, not wait_for: on Python 3.10/3.11 wait_for loses a cancellation that arrives as the
            # answer does (the caller's task runs on, e.g. a session's watch loop that close() then waits for)
            done, _ = await asyncio.wait({fut}, timeout=limit)
            if not done:
                raise TimeoutError
            return fut.result()
        except TimeoutError:
            self._give_up(rid, op)
            host = self.hello.get("hostname") or "the host"
            raise HelperTimeout(
                f"the helper on {host} did not answer `{_what(op, args)}` within {limit:.0f} s "
                "(a stalled file system, or a process stuck in the kernel?)"
            ) from None
        except asyncio.CancelledError:
            self._give_up(rid, op)
            raise

    def _give_up(self, rid: int, op: str) -> None:
        """Forget request ``rid``; a cancellable one is cancelled in the helper (its answer is ignored)."""
        fut = self._pending.pop(rid, None)
        self._whats.pop(rid, None)
        if fut is not None and not fut.done():
            fut.cancel()
        if op in CANCELLABLE and not self.closed:
            with contextlib.suppress(HelperGone):
                self._send({"id": next(self._ids), "op": "cancel", "target": rid})

    def stream(self, op: str, on_push: Callable[[dict], None], **args) -> Stream:
        """Start a streaming request; ``on_push`` gets each pushed dict on the event loop."""
        rid = next(self._ids)
        st = Stream(self, rid, on_push)
        self._streams[rid] = st
        try:
            self._send({"id": rid, "op": op, **args})
        except HelperGone:
            self._streams.pop(rid, None)
            raise
        return st

    async def close(self) -> None:
        """End the helper: close its stdin (it exits at once) and the channel."""
        if not self._process.is_closing():
            with contextlib.suppress(Exception):
                self._process.stdin.write_eof()
            self._process.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._process.wait_closed(), 5)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader

    # --- typed conveniences used by control/streams -------------------------------------------

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict | None = None,
        timeout: float | None = None,
        input: str | None = None,
    ) -> dict:
        return await self.call("run", argv=list(argv), cwd=cwd, env=env, timeout=timeout, input=input)

    async def proc(self, pid: int) -> dict | None:
        return await self.call("proc", pid=int(pid))

    async def read(
        self, path: str, offset: int = 0, length: int = 1 << 20, root: str | None = None
    ) -> tuple[bytes, int, int]:
        """(data, start offset, file size) of a regular file (a FIFO, a device or a link is refused).
        Negative offset counts from the end. With ``root``, ``path`` is relative to that directory and
        no part of it may be a link."""
        extra = {"root": root} if root is not None else {}
        r = await self.call("read", path=path, offset=offset, length=length, **extra)
        return b64decode(r["data"]), int(r["offset"]), int(r["size"])

    async def read_json(self, path: str) -> object | None:
        """A whole (small) JSON file, or None when it is absent or not valid JSON."""
        try:
            data, _, size = await self.read(path, 0)
        except HelperError as e:
            if e.kind in ("FileNotFoundError", "NotADirectoryError"):
                return None
            raise
        try:
            return loads(data)  # bounded and cleaned, as replies are
        except ValueError:
            return None

    async def stat(self, path: str) -> dict:
        return await self.call("stat", path=path)
