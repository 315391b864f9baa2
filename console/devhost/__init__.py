"""A local SSH host for the demo and the tests: in-process asyncssh server on 127.0.0.1 + `pct` stand-in."""

from console.devhost.server import DevHost
from console.devhost.thread import DevHostThread

__all__ = ["DevHost", "DevHostThread"]
