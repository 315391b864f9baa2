"""One asyncssh connection per host, with host keys checked and errors said plainly.

``connect(options)`` opens it (through ``-J`` jump hosts when asked, each checked the same way);
an unknown or changed host key raises :class:`HostKeyRefused` with the key's fingerprint.
``backoff(n)`` is the capped reconnect delay the session uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random

import asyncssh

from console.core.options import ConnectOptions
from console.core.sanitize import clean_text  # a server's disconnect reason is its own text


class ConnectError(Exception):
    """Could not connect (refused, unreachable, authentication failed, ...)."""

    retryable = True


class HostKeyRefused(ConnectError):
    """The server's host key is not in known_hosts (or differs from it). Not retried silently."""

    retryable = False


def backoff(attempt: int, base: float = 0.5, cap: float = 15.0) -> float:
    """Delay before reconnect attempt ``attempt`` (0-based): doubling from ``base``, capped, jittered."""
    d = min(cap, base * (2 ** min(attempt, 16)))
    return d * (0.8 + 0.4 * random.random())


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    user, sep, hostport = spec.rpartition("@")
    if not sep:
        user, hostport = None, spec
    port = None
    if hostport.startswith("["):  # [v6addr]:port
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif hostport.count(":") == 1:
        host, p = hostport.split(":")
        port = int(p)
    else:
        host = hostport
    return user or None, host, port


DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def _checked_against(host: str, kw: dict) -> tuple[str, int, str]:
    """(host name, port, known_hosts file(s)) that asyncssh used for ``host``: ssh_config applied
    (``HostName``, ``Port``, ``UserKnownHostsFile`` of an alias), the explicit options over it."""
    keep = {k: kw[k] for k in ("port", "config", "known_hosts") if k in kw}
    try:
        o = asyncssh.SSHClientConnectionOptions(host=host, client_keys=None, agent_path=None, **keep)
    except (OSError, ValueError, asyncssh.Error):  # an unreadable config: say what we were given
        return host, int(kw.get("port") or 22), str(kw.get("known_hosts") or DEFAULT_KNOWN_HOSTS)
    files = o.known_hosts
    if isinstance(files, (list, tuple)):  # [] (no UserKnownHostsFile): asyncssh's default file
        files = ", ".join(str(f) for f in files) or DEFAULT_KNOWN_HOSTS
    return (
        str(o.host),
        int(o.port),
        str(files) if isinstance(files, (str, os.PathLike)) else DEFAULT_KNOWN_HOSTS,
    )


def _refusal(host: str, kw: dict, fp: str) -> str:
    name, port, files = _checked_against(host, kw)
    where = f"[{name}]:{port}" if port != 22 else name
    if name != host:
        where += f" ({host})"
    first = files.split(", ")[0]
    return (
        f"host key of {where} is not trusted: it is unknown to or differs from {files}; the server offered "
        f"{fp}. Check it out of band; if it is right, add it to known_hosts (e.g. `ssh-keyscan -p {port} "
        f"{name} >> {first}` after checking the fingerprint). Refusing to connect."
    )


async def _fingerprint(host: str, kw: dict, tunnel) -> str:
    """The server's host key fingerprint, fetched without authenticating (for the refusal message)."""
    keep = {k: kw[k] for k in ("port", "config") if k in kw}
    if tunnel is not None:
        keep["tunnel"] = tunnel
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(host, **keep), kw.get("connect_timeout", 15)
        )
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        return "(could not fetch the key)"
    if key is None:
        return "(no key offered)"
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


async def _connect_one(host: str, kw: dict, options: ConnectOptions, tunnel=None):
    try:
        return await asyncssh.connect(host, tunnel=tunnel if tunnel is not None else (), **kw)
    except asyncssh.HostKeyNotVerifiable as e:
        raise HostKeyRefused(_refusal(host, kw, await _fingerprint(host, kw, tunnel))) from e
    except asyncssh.PermissionDenied as e:
        err = ConnectError(f"authentication failed for {options.display}: {clean_text(str(e.reason or e))}")
        err.retryable = False
        raise err from e
    except asyncssh.Error as e:
        raise ConnectError(f"ssh to {options.display} failed: {clean_text(str(e.reason or e))}") from e
    except OSError as e:
        raise ConnectError(f"cannot reach {options.display}: {e.strerror or e}") from e


async def connect(options: ConnectOptions) -> asyncssh.SSHClientConnection:
    """Open the connection; raises ConnectError / HostKeyRefused with a message for the operator."""
    kw = options.connect_kwargs()
    tunnel = None
    if options.jump:
        for spec in options.jump.split(","):
            user, host, port = _parse_jump(spec.strip())
            jkw = {k: v for k, v in kw.items() if k not in ("port", "username")}
            if user:
                jkw["username"] = user
            if port:
                jkw["port"] = port
            try:
                tunnel = await _connect_one(host, jkw, options, tunnel)
            except ConnectError as e:
                raise type(e)(f"jump host {spec}: {e}") from e
    try:
        conn = await _connect_one(options.host, kw, options, tunnel)
    except BaseException:
        if tunnel is not None:
            tunnel.close()
        raise
    if tunnel is not None:
        jump = tunnel

        async def _close_jump() -> None:
            with contextlib.suppress(Exception):
                await conn.wait_closed()
            jump.close()

        asyncio.get_running_loop().create_task(_close_jump())
    return conn
