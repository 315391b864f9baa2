"""Real Podman (Debian's podman 4.3 with runc): storage, run folder and settings of its own, handed to every
podman on the devhost through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, as a user would set them. runc, not
crun (crun refuses this kernel's cgroup layout), cgroupfs, no network, explicit ulimits (the defaults need a
capability root lacks here). Containers run from a skeleton ``--rootfs``: no image at all."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.runtimes.common import INIT, Engine, need, skeleton


class Podman(Engine):
    PROGRAM = "podman"

    def __init__(self, root: Path, run_root: Path) -> None:
        need("podman runc", "podman", "runc")
        super().__init__()
        self.root, self.run_root = root, run_root
        root.mkdir(parents=True, exist_ok=True)
        (root / "containers.conf").write_text(
            "[containers]\n"
            'netns = "none"\n'
            'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
            "[engine]\n"
            # its own tmp dir and file locks: podman's defaults (/run/libpod, one shared-memory lock table)
            # are one per machine, and a second storage beside them "refreshes" the first one's containers
            f'tmp_dir = "{root}/tmp"\n'
            'lock_type = "file"\n'
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

    def start(self, name: str) -> str:
        """A running container ``name`` (its root a skeleton, the binds at their own paths)."""
        rootfs = skeleton(self.root / "rootfs" / name)
        vols = self.volumes()
        self.cli("run", "-d", "--name", name, *vols, "--rootfs", str(rootfs), "python3", "-c", INIT)
        self.names.append(name)
        return name

    def close(self) -> None:
        for name in self.names:
            self.cli("rm", "-f", "-t", "0", name, check=False, timeout=60)
        self.cli("system", "reset", "-f", check=False, timeout=60)
        _kill_left(str(self.root))
        shutil.rmtree(self.root / "storage", ignore_errors=True)


def _kill_left(root: str) -> None:
    """SIGKILL the container monitors (conmon) of this storage that outlived ``podman rm`` (a podman that
    lost track of a container), and what runs under them: nothing of a test is left running."""
    for proc in Path("/proc").iterdir():
        try:
            ours = proc.name.isdigit() and proc.joinpath("comm").read_text().strip() == "conmon"
            if ours and root in proc.joinpath("cmdline").read_text():
                subprocess.run(["pkill", "-KILL", "-P", proc.name], timeout=10)
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
