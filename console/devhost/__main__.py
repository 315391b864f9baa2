"""``python -m console.devhost ROOT [--ct N ...]``: serve a DevHost until interrupted.

Prints one JSON line (port, user, client key, known_hosts, containers) so that a script or a
person can point ``ssh``/``dflash-console`` at it. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal

from console.devhost.server import DevHost


async def _serve(args: argparse.Namespace) -> None:
    env = dict(kv.split("=", 1) for kv in args.env)
    async with DevHost(args.root, port=args.port, env=env) as h:
        cts = [str(h.add_container(ct)) for ct in args.ct]
        print(
            json.dumps(
                {
                    "host": h.host,
                    "port": h.port,
                    "user": h.user,
                    "client_key": str(h.client_key_path),
                    "known_hosts": str(h.known_hosts_path),
                    "containers": cts,
                    "fingerprint": h.host_fingerprint,
                }
            ),
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m console.devhost", description=__doc__.splitlines()[0])
    p.add_argument("root", help="folder for keys, bin/ (pct, python3) and ct/N containers")
    p.add_argument("--ct", type=int, action="append", default=[], metavar="N", help="create container N")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for sessions")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(p.parse_args()))


if __name__ == "__main__":
    main()
