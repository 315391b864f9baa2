"""Connection options, as ssh takes them: ``user@host``, -p, -l, -i, -F, -J, known_hosts.

:class:`ConnectOptions` is what the CLI, the screen and the demo hand to :class:`Session`;
``options_from_args`` builds it from the CLI's connection flags, ``connect_kwargs()`` turns it into
asyncssh arguments. Unset fields stay unset so that
``~/.ssh/config`` (or ``-F FILE``) supplies them, as it would for ssh.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field


@dataclass
class ConnectOptions:
    host: str
    port: int | None = None
    user: str | None = None
    identity_files: list[str] = field(default_factory=list)
    config_files: list[str] | None = None  # None: ~/.ssh/config when it exists
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts (checked; never disabled)
    jump: str | None = None  # -J [user@]host[:port][,...]
    keepalive_interval: float = 10.0
    keepalive_count_max: int = 3
    connect_timeout: float = 15.0

    @classmethod
    def from_target(cls, target: str, **kwargs) -> ConnectOptions:
        """``user@host`` or ``host``; an explicit user in the target wins over ``user=``, as in ssh."""
        user, sep, host = target.rpartition("@")
        if sep:
            kwargs["user"] = user
        else:
            host = target
        if not host:
            raise ValueError(f"no host in {target!r}")
        return cls(host=host, **kwargs)

    @property
    def display(self) -> str:
        s = f"{self.user}@{self.host}" if self.user else self.host
        return f"{s}:{self.port}" if self.port else s

    def connect_kwargs(self) -> dict:
        """Keyword arguments for ``asyncssh.connect`` (host and tunnel excluded)."""
        kw: dict = {
            "keepalive_interval": self.keepalive_interval,
            "keepalive_count_max": self.keepalive_count_max,
            "connect_timeout": self.connect_timeout,
        }
        if self.port is not None:
            kw["port"] = self.port
        if self.user is not None:
            kw["username"] = self.user
        if self.identity_files:
            kw["client_keys"] = [os.path.expanduser(p) for p in self.identity_files]
        if self.config_files is not None:
            kw["config"] = [os.path.expanduser(p) for p in self.config_files]
        if self.known_hosts is not None:
            kw["known_hosts"] = os.path.expanduser(self.known_hosts)
        return kw


def options_from_args(args: argparse.Namespace) -> ConnectOptions:
    """ConnectOptions from the CLI's connection flags (HOST, -p, -l, -i, -F, -J, --known-hosts)."""
    return ConnectOptions.from_target(
        args.host,
        port=args.port,
        user=args.user,
        identity_files=list(args.identity or []),
        config_files=[args.config] if args.config else None,
        known_hosts=args.known_hosts,
        jump=args.jump,
    )
