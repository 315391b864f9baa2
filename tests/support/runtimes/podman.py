"""Real Podman (Debian's podman 4.3 with runc): storage, run folder and settings of its own, handed to every
podman on the devhost through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, as a user would set them. runc, not
crun (crun refuses this kernel's cgroup layout), cgroupfs, no network, explicit ulimits (the defaults need a
capability root lacks here). Containers run from a skeleton ``--rootfs``: no image at all."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.runtimes.common import INIT, binds, need, run, skeleton


class Podman:
    PROGRAM = "podman"

    def __init__(self, root: Path, run_root: Path) -> None:
        need("podman runc", "podman", "runc")
        self.root, self.run_root = root, run_root
        root.mkdir(parents=True, exist_ok=True)
        (root / "containers.conf").write_text(
            "[containers]\n"
            'netns = "none"\n'
            'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{root}/events.log"\n'
        )
        (root / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n'
        )
        self.env = {
            "CONTAINERS_CONF": str(root / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        }
        self.names: list[str] = []

    def cli(self, *args: str, **kw):
        import os

        return run([self.PROGRAM, *args], env={**os.environ, **self.env}, **kw)

    def start(self, name: str) -> str:
        """A running container ``name`` (its root a skeleton, the binds at their own paths)."""
        rootfs = skeleton(self.root / "rootfs" / name)
        vols = [a for p in binds(self.run_root) for a in ("-v", f"{p}:{p}")]
        self.cli("run", "-d", "--name", name, *vols, "--rootfs", str(rootfs), "python3", "-c", INIT)
        self.names.append(name)
        return name

    def exec(self, name: str, *argv: str, **kw):
        return self.cli("exec", name, *argv, **kw)

    def close(self) -> None:
        for name in self.names:
            self.cli("rm", "-f", "-t", "0", name, check=False, timeout=60)
        self.cli("system", "reset", "-f", check=False, timeout=60)
        shutil.rmtree(self.root / "storage", ignore_errors=True)
