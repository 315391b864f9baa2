"""An SSH host on 127.0.0.1 for the demo and the tests: real sshd behaviour, in-process.

``async with DevHost(root) as h:`` listens on 127.0.0.1 (port 0 unless given) with a fresh host key,
accepts only its own fresh client key, and writes a known_hosts line for itself. Each exec request
runs the command with ``/bin/sh -c`` as a real local process, as sshd does, with ``root/bin`` first
on PATH: there lie the ``pct`` stand-in (``pct exec N -- cmd`` runs cmd in the folder that plays
container N) and a ``python3`` that is the interpreter running this server (so the trainer's
dependencies are there). Signals are never delivered through channels, as with a real pct/lxc-attach.

``stop()`` drops every connection and ends the processes its sessions started (not what they
detached: a trainer launched with setsid lives on, as on a real host); ``start()`` listens again
on the same port with the same keys, so clients can reconnect. It forwards TCP to 127.0.0.1 only,
so it can be its own ``-J`` jump host.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import signal
import sys
from pathlib import Path

import asyncssh

from console.devhost.pct import write_pct

LOOPBACK = "127.0.0.1"


class _Server(asyncssh.SSHServer):
    def __init__(self, host: DevHost) -> None:
        self._host = host
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._host._conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._host._conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True  # public key only (set on the server): no password, no keyboard-interactive

    def password_auth_supported(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        # Direct TCP forwarding to loopback only: enough to serve as a `-J` jump host for itself.
        return dest_host in (LOOPBACK, "localhost")


class DevHost:
    """See the module docstring. Attributes after start: port, known_hosts_path, client_key_path, user."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        port: int = 0,
        env: dict[str, str] | None = None,
        python: str | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.port = port
        self.user = getpass.getuser()
        self.host = LOOPBACK
        self.env_overrides = dict(env or {})
        self.python = python or sys.executable
        self.ssh_dir = self.root / "ssh"
        self.bin_dir = self.root / "bin"
        self.known_hosts_path = self.ssh_dir / "known_hosts"
        self.client_key_path = self.ssh_dir / "client_key"
        self.host_key_path = self.ssh_dir / "host_key"
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._conns: set[asyncssh.SSHServerConnection] = set()
        self._procs: set[asyncio.subprocess.Process] = set()
        self._tasks: set[asyncio.Task] = set()
        self._prepared = False

    # --- setup -------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._prepared:
            return
        self.ssh_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.ssh_dir, 0o700)
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        host_key.write_private_key(str(self.host_key_path))
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key.write_private_key(str(self.client_key_path))
        client_key.write_public_key(str(self.client_key_path) + ".pub")
        os.chmod(self.client_key_path, 0o600)
        self._host_key = host_key
        self._authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode("ascii"))
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        write_pct(self.bin_dir / "pct", self.root / "ct")
        py = self.bin_dir / "python3"
        py.write_text(f'#!/bin/sh\nexec {shlex.quote(self.python)} "$@"\n')
        py.chmod(0o755)
        (self.root / "home").mkdir(exist_ok=True)
        self._prepared = True

    def add_container(self, ct: int) -> Path:
        """Create the folder that plays container ``ct`` (its HOME and working directory)."""
        d = self.root / "ct" / str(int(ct))
        d.mkdir(parents=True, exist_ok=True)
        return d

    def container_dir(self, ct: int) -> Path:
        return self.root / "ct" / str(int(ct))

    @property
    def host_public_key(self) -> str:
        return self._host_key.export_public_key().decode("ascii").strip()

    @property
    def host_fingerprint(self) -> str:
        return self._host_key.get_fingerprint("sha256")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["HOME"] = str(self.root / "home")
        env.pop("PYTHONPATH", None)
        env.update(self.env_overrides)
        return env

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> DevHost:
        self._prepare()
        self._acceptor = await asyncssh.create_server(
            lambda: _Server(self),
            LOOPBACK,
            self.port,
            server_host_keys=[self._host_key],
            authorized_client_keys=self._authorized,
            process_factory=self._on_process,
            encoding=None,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
            keepalive_interval=0,
        )
        self.port = self._acceptor.sockets[0].getsockname()[1]
        hostpat = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        self.known_hosts_path.write_text(f"{hostpat} {self.host_public_key}\n")
        return self

    async def stop(self) -> None:
        """Stop listening, drop every connection, end the session processes (TERM, then KILL)."""
        if self._acceptor is not None:
            self._acceptor.close()
            with contextlib.suppress(Exception):
                await self._acceptor.wait_closed()
            self._acceptor = None
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()
        await self._end_procs()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def restart(self, pause: float = 0.0) -> None:
        """Drop everything, optionally stay down for ``pause`` seconds, then listen again (same port)."""
        await self.stop()
        if pause:
            await asyncio.sleep(pause)
        await self.start()

    async def __aenter__(self) -> DevHost:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _end_procs(self) -> None:
        procs = [p for p in self._procs if p.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        if procs:
            _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=3)
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(p.wait(), 3)
        self._procs.clear()

    # --- sessions ----------------------------------------------------------------------------------

    def _on_process(self, process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.get_running_loop().create_task(self._run_session(process))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_session(self, process: asyncssh.SSHServerProcess) -> None:
        command = process.command
        if not command:
            process.stderr.write(b"devhost: interactive shells are not offered; give a command\n")
            process.exit(1)
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env(),
                cwd=str(self.root / "home"),
                start_new_session=True,  # a process group of its own: stop() can end it whole
                limit=1 << 20,
            )
        except OSError as e:
            process.stderr.write(f"devhost: {e}\n".encode())
            process.exit(127)
            return
        self._procs.add(proc)

        async def pump_in() -> None:
            try:
                while True:
                    data = await process.stdin.read(65536)
                    if not data:
                        break
                    proc.stdin.write(data)
                    await proc.stdin.drain()
            except (asyncssh.Error, OSError, ConnectionError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    proc.stdin.close()

        async def pump_out(fd: int, src: asyncio.StreamReader, dst) -> None:
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    dst.write(data)
                    await dst.drain()
            except (asyncssh.Error, OSError, ConnectionError):
                # The channel is gone: close our end of the pipe as sshd does, so the process's next
                # write gets SIGPIPE instead of blocking on a pipe nobody reads.
                with contextlib.suppress(Exception):
                    proc._transport.get_pipe_transport(fd).close()

        tin = asyncio.ensure_future(pump_in())
        try:
            await asyncio.gather(
                pump_out(1, proc.stdout, process.stdout), pump_out(2, proc.stderr, process.stderr)
            )
            rc = await proc.wait()
        finally:
            tin.cancel()
            self._procs.discard(proc)
        with contextlib.suppress(Exception):
            process.exit(rc if rc >= 0 else 128 - rc)
