"""A Slurm job: the helper and nvidia-smi run inside the job's allocation as an extra step on its first
node (node 0, the one that runs the batch script, so the launcher), ``srun --jobid=J --overlap -N1 -n1
--relative=0 argv``
(``--slurm JOB``, ``slurm = "..."``). JOB is a job id, or a job name: the running job of that name, looked
up with ``squeue`` at each connect (a restart submits a new job under the same name); with none running,
the host itself, where a launch submits one (``sbatch -J NAME``, the trainer ``exec``'d as the batch
script, ``--signal=B:INT@120`` so that a job reaching its time limit ends in a checkpoint; a run of several
nodes, ``--launch torchrun --nnodes N``, as :mod:`console.core.places.slurm_nodes` writes it)."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import ClassVar

from console.core.places import slurm_nodes
from console.core.places.base import PlaceError, Runtime, check_name

# The name's running job, then srun into it; with none running, the host itself (the login node: where a
# launch submits the job). argv reaches srun as "$@", never through the shell's parser.
_BY_NAME = (
    'j=$(squeue -h -n "$0" -t RUNNING -o %i | head -n 1); '
    '[ -n "$j" ] || exec "$@"; '
    'exec srun --jobid="$j" --overlap -N1 -n1 --relative=0 --quiet "$@"'
)
# The job(s) asked about, then the pending queue in priority order (a pending job's position in it)
_WITH_QUEUE = 'squeue -h "$@"; rc=$?; echo "#queue"; squeue -h -t PENDING --sort=-p,i -o "%i|%P"; exit $rc'
SIGNAL_BEFORE_END_S = 120  # SIGINT to the trainer this long before the time limit: it ends in a checkpoint


@dataclass(frozen=True)
class Slurm(Runtime):
    FLAG: ClassVar[str | None] = "--slurm"
    KEY: ClassVar[str | None] = "slurm"
    JSON: ClassVar[str | None] = "slurm"
    TYPE: ClassVar[type] = str
    TOOL: ClassVar[str] = "srun"
    SCHEDULER: ClassVar[str | None] = "sbatch"
    LABEL: ClassVar[str] = "job"
    NOUN: ClassVar[str] = "Slurm job"
    METAVAR: ClassVar[str] = "JOB"
    HELP: ClassVar[str] = "Slurm job (id or name): run everything via `srun --jobid=J --overlap -N1 -n1`"

    job: str

    def __post_init__(self) -> None:
        self.check()
        check_name(str(self.KEY), "job", self.job)

    @property
    def value(self) -> str:
        return self.job

    @property
    def by_id(self) -> bool:
        return self.job.isdigit()

    def wrap(self, argv: list[str]) -> list[str]:
        if self.by_id:
            return [
                "srun",
                f"--jobid={self.job}",
                "--overlap",
                "-N1",
                "-n1",
                "--relative=0",
                "--quiet",
                *argv,
            ]
        return ["sh", "-c", _BY_NAME, self.job, *argv]

    def check_launch(self) -> None:
        if self.by_id:
            raise PlaceError(f"a launch submits a new job: name it (--slurm NAME), not by job id {self.job}")

    def submit(self, argv: list[str], *, log: str, cwd: str) -> list[str]:
        self.check_launch()
        several = slurm_nodes.batch(argv)  # --launch torchrun: the launcher here, torchrun on every node
        return [
            "sbatch",
            "--parsable",
            f"--job-name={self.job}",
            f"--output={log}",
            "--open-mode=append",
            f"--chdir={cwd}",
            f"--signal=B:INT@{SIGNAL_BEFORE_END_S}",
            "--export=ALL",
            *(several.sbatch if several else []),
            # exec: the batch script is the trainer (the launcher), and gets the SIGINT
            f"--wrap={several.script if several else 'exec ' + shlex.join(argv)}",
        ]

    def submitted(self, stdout: str) -> str | None:
        job = stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
        return job if job.isdigit() else None

    def job_argv(self, job: str) -> list[str]:
        return self._squeue("-j", job)

    @staticmethod
    def _squeue(*select: str) -> list[str]:
        return ["sh", "-c", _WITH_QUEUE, "squeue", *select, "-O", FIELDS]

    def ended(self, state: dict | None) -> bool:
        return state is None or state["state"] not in _ORDER

    def state_argv(self) -> list[str]:
        return self.job_argv(self.job) if self.by_id else self._squeue("-n", self.job)

    def state(self, stdout: str) -> dict | None:
        jobs, _, queue = stdout.partition("#queue\n")
        job = pick_job(parse_jobs(jobs))
        if job and job["state"] == "PENDING":
            job.update(queue_position(queue, job["job"], job["partition"]))
        return job

    def run_dir(self, state: dict | None) -> str | None:
        """The job's run dir where the job says it: its output file is ``RUN_DIR/train.log`` (a launch
        from the console writes it so). On a node every trainer's process is visible: this one is the job's."""
        out = (state or {}).get("stdout") or ""
        return posixpath.dirname(out) if posixpath.isabs(out) and out.endswith("/train.log") else None


# squeue's fields (-O, no padding, "|" after each), one job a line: id, state, reason, time used, time
# left, time limit, nodes, partition, output file (last: a path may hold "|")
FIELDS = "JobID:0|,State:0|,Reason:0|,TimeUsed:0|,TimeLeft:0|,TimeLimit:0|,NodeList:0|,Partition:0|,STDOUT:0"
_ORDER = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "PENDING")


def parse_jobs(stdout: str, limit: int = 64) -> list[dict]:
    """squeue's lines (:data:`FIELDS`) as dicts; bounded, and a line of another shape skipped."""
    out = []
    for line in stdout.splitlines()[:limit]:
        parts = line.strip().split("|", 8)
        if len(parts) != 9 or not parts[0].strip().isdigit():
            continue
        job, state, reason, used, left, lim, nodes, partition = (p.strip()[:200] for p in parts[:8])
        out.append(
            {
                "job": job,
                "state": state,
                "reason": "" if reason in ("None", "(null)") else reason,
                "used_s": duration_s(used),
                "left_s": duration_s(left),
                "limit_s": duration_s(lim),
                "nodes": nodes,
                "partition": partition,
                "stdout": parts[8].strip()[:4096],
            }
        )
    return out


def queue_position(queue: str, job: str, partition: str, limit: int = 100_000) -> dict:
    """``{"position": P, "queued": Q}``: the pending job ``job`` is the P-th of Q pending jobs of its
    partition in priority order (``squeue --sort=-p,i``: the order the main scheduler tries them; backfill
    may start a later one first); {} when the queue does not show it. Bounded."""
    ids = []
    for line in queue.splitlines()[:limit]:
        jid, _, part = line.strip().partition("|")
        if jid.isdigit() and part.strip() == partition:
            ids.append(jid)
    return {"position": ids.index(job) + 1, "queued": len(ids)} if job in ids else {}


def pick_job(jobs: list[dict]) -> dict | None:
    """The job a name means: a running one first, then a pending one, else the first."""
    for state in _ORDER:
        for j in jobs:
            if j["state"] == state:
                return j
    return jobs[0] if jobs else None


def duration_s(text: str) -> int | None:
    """Slurm's ``[days-][hours:]minutes:seconds`` in seconds; None for UNLIMITED, INVALID, NOT_SET."""
    days, sep, rest = text.rpartition("-")
    parts = rest.split(":")
    if (sep and not days.isdigit()) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return secs + int(days or 0) * 86400
