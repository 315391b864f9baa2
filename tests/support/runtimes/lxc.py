"""Real LXC (Debian's lxc 5.0): containers under an LXC path of the fixture's own, reached with
``lxc-attach -n NAME -P PATH`` (what ``pct exec`` runs on a Proxmox host). No network
(``lxc.net.0.type = empty``), unconfined (no AppArmor here), the binds as ``lxc.mount.entry``. Also a ``pct``
that runs ``lxc-attach`` into them: Proxmox's ``pct exec N --`` with real LXC under it (a stand-in for
Proxmox's own tooling only)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from pathlib import Path

from tests.support.runtimes.common import INIT, binds, need, run, skeleton

_PCT = """#!/bin/sh
# pct stand-in over real LXC (tests/support/runtimes/lxc.py): `pct exec N -- CMD...` -> lxc-attach
if [ "$1" != exec ] || [ $# -lt 3 ]; then echo "pct (stand-in): only 'pct exec N -- CMD' is offered" >&2; exit 2; fi
ct=$2; shift 2; [ "$1" = "--" ] && shift
if [ ! -f {path}/"$ct"/config ]; then
    echo "Configuration file 'nodes/stand-in/lxc/$ct.conf' does not exist" >&2; exit 2
fi
exec lxc-attach -n "$ct" -P {path} -- "$@"
"""


class Lxc:
    PROGRAM = "lxc-attach"

    def __init__(self, root: Path, run_root: Path) -> None:
        need("lxc", "lxc-start", "lxc-attach")
        self.root, self.run_root = root, run_root
        self.path = root / "lxc"
        self.path.mkdir(parents=True, exist_ok=True)
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "pct").write_text(_PCT.format(path=shlex.quote(str(self.path))))
        (bin_dir / "pct").chmod(0o755)
        # the devhost's sessions find this pct first (and lxc-attach where Debian puts it)
        self.env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.names: list[str] = []

    def config(self, name: str, rootfs: Path) -> str:
        lines = [
            f"lxc.uts.name = {name}",
            f"lxc.rootfs.path = dir:{rootfs}",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.autodev = 1",
            "lxc.mount.auto = proc:mixed sys:ro",
            "lxc.init.cmd = /usr/bin/python3 /init.py",
            "lxc.prlimit.nofile = 1024",
        ]
        lines += [
            f"lxc.mount.entry = {p} {str(p).lstrip('/')} none bind,create=dir 0 0"
            for p in binds(self.run_root)
        ]
        return "\n".join(lines) + "\n"

    def start(self, name: str) -> str:
        """A running container ``name``; returns its ``--lxc`` value (``LXCPATH/NAME``)."""
        d = self.path / name
        rootfs = skeleton(d / "rootfs")
        (rootfs / "init.py").write_text(INIT)
        (d / "config").write_text(self.config(name, rootfs))
        run(["lxc-start", "-n", name, "-P", str(self.path), "-d", "-l", "INFO", "-o", str(d / "lxc.log")])
        run(["lxc-wait", "-n", name, "-P", str(self.path), "-s", "RUNNING", "-t", "30"], timeout=60)
        self.names.append(name)
        return f"{self.path}/{name}"

    def exec(self, name: str, *argv: str, **kw):
        return run(["lxc-attach", "-n", name, "-P", str(self.path), "--", *argv], **kw)

    def close(self) -> None:
        for name in self.names:
            run(["lxc-stop", "-n", name, "-P", str(self.path), "-k"], check=False, timeout=60)
        for base in Path("/sys/fs/cgroup").glob("*"):
            for name in self.names:
                for d in (base / f"lxc.payload.{name}", base / f"lxc.monitor.{name}"):
                    if d.is_dir():
                        for sub in [*sorted(d.rglob("*"), reverse=True), d]:
                            if sub.is_dir():
                                with contextlib.suppress(OSError):  # a cgroup still in use: left
                                    sub.rmdir()
        shutil.rmtree(self.path, ignore_errors=True)
