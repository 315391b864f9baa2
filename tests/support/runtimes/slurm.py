"""Real Slurm (Debian's slurm-wlm 22.05 + munge): two nodes on this one machine (``node1``, ``node2``: two
slurmd, each on a port of its own, as Debian's build allows), munged, slurmctld and the slurmds started by
hand with a slurm.conf, munge socket, state and spool of the fixture's own, on free loopback ports; every
Slurm command on the devhost finds it through SLURM_CONF. ``proctrack/linuxproc`` (no cgroup plugin works
here)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from tests.support.runtimes.common import need, run, stop_pid, until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODES = ("node1", "node2")


def _conf(w: Path, host: str) -> str:
    nodes = "".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
        f"CPUs={os.cpu_count() or 2} RealMemory=1000 State=UNKNOWN\n"
        for n in NODES
    )
    return f"""ClusterName=dflash
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={w}/munge.sock
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool/%n
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd-%n.pid
SlurmctldLogFile={w}/slurmctld.log
SlurmdLogFile={w}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
KillWait=5
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class Slurm:
    PROGRAM = "srun"

    def __init__(self, root: Path, run_root: Path) -> None:
        need("slurm-wlm munge", "slurmctld", "slurmd", "munged", "srun")
        self.root, self.run_root, w = root, run_root, root
        self._munged: subprocess.Popen | None = None
        for d in ("state", "key", *(f"spool/{n}" for n in NODES)):
            (w / d).mkdir(parents=True, exist_ok=True)
        os.chmod(w / "key", 0o700)
        run(["mungekey", "-c", "-k", str(w / "key/munge.key")])
        (w / "slurm.conf").write_text(_conf(w, socket.gethostname().split(".")[0]))
        self.env = {"SLURM_CONF": str(w / "slurm.conf")}
        self._env = {**os.environ, **self.env}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        w = self.root
        self._munged = subprocess.Popen(
            ["munged", "-F", "--force", "-S", f"{w}/munge.sock", f"--key-file={w}/key/munge.key",
             f"--pid-file={w}/munged.pid", f"--seed-file={w}/key/munged.seed", f"--log-file={w}/munged.log"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        until(lambda: (w / "munged.pid").exists() and (w / "munge.sock").exists(), 30, "munged")
        run(["slurmctld", "-f", f"{w}/slurm.conf", "-i"], env=self._env)  # daemonizes
        for node in NODES:
            run(["slurmd", "-f", f"{w}/slurm.conf", "-N", node], env=self._env)
        idle = lambda: self.cli("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split() == ["idle"] * 2  # noqa: E731
        until(idle, 60, "the Slurm nodes to be idle", step=0.3)

    def cli(self, *args: str, **kw):
        return run(list(args), env=self._env, **kw)

    def submit(self, name: str, command: str, *sbatch: str, cwd: Path) -> str:
        """``sbatch -J name ... --wrap command``; the job id."""
        r = self.cli("sbatch", "--parsable", "-J", name, *sbatch, "--wrap", command, cwd=str(cwd))
        return r.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        return self.cli("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()

    def exec(self, job: str, *argv: str, **kw):
        return self.cli("srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "--quiet", *argv, **kw)

    def close(self) -> None:
        self.cli("scancel", "-u", "root", check=False, timeout=30)
        try:
            until(lambda: not self.cli("squeue", "-h", check=False).stdout.strip(), 30, "the jobs to end")
        except TimeoutError:
            pass
        for daemon in (*(f"slurmd-{n}" for n in NODES), "slurmctld"):
            stop_pid(self.root / f"{daemon}.pid")
        _kill_left(self.env["SLURM_CONF"])
        munged = self._munged
        if munged is not None:  # our child: terminated and reaped here
            munged.terminate()
            try:
                munged.wait(10)
            except subprocess.TimeoutExpired:
                munged.kill()
                munged.wait(10)


def _kill_left(conf: str) -> None:
    """SIGKILL what still runs with this cluster's SLURM_CONF (a job's processes that outlived the jobs'
    cancel, e.g. daemons stopped while it was under way): nothing of a test is left running."""
    mark = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in proc.joinpath("environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
