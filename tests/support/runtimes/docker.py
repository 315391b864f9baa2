"""Real Docker (Debian's docker.io 20.10): a dockerd of its own, started by hand (no systemd here) on a socket,
data root and exec root under the fixture's folder, without iptables or a bridge, reached through DOCKER_HOST
as a user's docker CLI on the SSH host would be. Its one image is a skeleton root imported from a local tar
(``docker import``); every run is ``--pull=never``."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

from tests.support.runtimes.common import INIT, Engine, need, skeleton, until

IMAGE = "dflash-skeleton:test"


class Docker(Engine):
    PROGRAM = "docker"

    def __init__(self, root: Path, run_root: Path) -> None:
        need("docker.io", "dockerd", "docker")
        super().__init__()
        self.root, self.run_root = root, run_root
        root.mkdir(parents=True, exist_ok=True)
        sock = root / "docker.sock"
        self.env = {"DOCKER_HOST": f"unix://{sock}"}
        self._log = open(root / "dockerd.log", "ab")  # noqa: SIM115 (held for the daemon's life)
        self._proc = subprocess.Popen(
            ["dockerd", "--host", f"unix://{sock}", "--data-root", str(root / "data"),
             "--exec-root", str(root / "exec"), "--pidfile", str(root / "dockerd.pid"),
             "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-masq=false",
             "--exec-opt", "native.cgroupdriver=cgroupfs"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, start_new_session=True,
        )  # fmt: skip
        try:
            until(lambda: self.cli("version", check=False, timeout=10).returncode == 0, 60, "dockerd")
            self._image()
        except BaseException:
            self.close()
            raise

    def _image(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(skeleton(self.root / "skeleton"), arcname=".")
        p = subprocess.run(
            [self.PROGRAM, "import", "-", IMAGE], input=buf.getvalue(), capture_output=True,
            env={**os.environ, **self.env}, timeout=120,
        )  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"docker import: {p.stderr.decode(errors='replace')}")

    def start(self, name: str) -> str:
        vols = self.volumes()
        self.cli(
            "run", "-d", "--pull=never", "--network=none", "--name", name, *vols, IMAGE, "python3", "-c", INIT
        )
        self.names.append(name)
        return name

    def close(self) -> None:
        for name in self.names:
            self.cli("rm", "-f", name, check=False, timeout=60)
        # dockerd stops its containerd and then waits ~20 s on the socket that went with it: a short grace,
        # then the whole session it leads (dockerd, containerd), which holds nothing of ours any more.
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(30)
        self._log.close()
        subprocess.run(["umount", "-R", str(self.root / "exec")], capture_output=True, timeout=30)
        shutil.rmtree(self.root / "data", ignore_errors=True)
