"""A Slurm job: the helper and nvidia-smi run inside the job's allocation as an extra step on its first
node (the one that runs the batch script, so the launcher), ``srun --jobid=J --overlap -N1 -n1 argv``
(``--slurm JOB``, ``slurm = "..."``). JOB is a job id, or a job name: the running job of that name, looked
up with ``squeue`` at each connect (a restart submits a new job under the same name); with none running,
the host itself, where a launch submits one (``sbatch -J NAME``, the trainer ``exec``'d as the batch
script, ``--signal=B:INT@120`` so that a job reaching its time limit ends in a checkpoint)."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import ClassVar

from console.core.places.base import PlaceError, Runtime, check_name

# The name's running job, then srun into it; with none running, the host itself (the login node: where a
# launch submits the job). argv reaches srun as "$@", never through the shell's parser.
_BY_NAME = (
    'j=$(squeue -h -n "$0" -t RUNNING -o %i | head -n 1); '
    '[ -n "$j" ] || exec "$@"; '
    'exec srun --jobid="$j" --overlap -N1 -n1 --quiet "$@"'
)
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
            return ["srun", f"--jobid={self.job}", "--overlap", "-N1", "-n1", "--quiet", *argv]
        return ["sh", "-c", _BY_NAME, self.job, *argv]

    def check_launch(self) -> None:
        if self.by_id:
            raise PlaceError(f"a launch submits a new job: name it (--slurm NAME), not by job id {self.job}")

    def submit(self, argv: list[str], *, log: str, cwd: str) -> list[str]:
        self.check_launch()
        return [
            "sbatch",
            "--parsable",
            f"--job-name={self.job}",
            f"--output={log}",
            "--open-mode=append",
            f"--chdir={cwd}",
            f"--signal=B:INT@{SIGNAL_BEFORE_END_S}",
            "--export=ALL",
            f"--wrap=exec {shlex.join(argv)}",  # exec: the batch script is the trainer, and gets the SIGINT
        ]

    def submitted(self, stdout: str) -> str | None:
        job = stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
        return job if job.isdigit() else None

    def job_argv(self, job: str) -> list[str]:
        return ["squeue", "-h", "-j", job, "-O", FIELDS]

    def ended(self, state: dict | None) -> bool:
        return state is None or state["state"] not in _ORDER

    def state_argv(self) -> list[str]:
        return self.job_argv(self.job) if self.by_id else ["squeue", "-h", "-n", self.job, "-O", FIELDS]

    def state(self, stdout: str) -> dict | None:
        return pick_job(parse_jobs(stdout))

    def run_dir(self, state: dict | None) -> str | None:
        """The job's run dir where the job says it: its output file is ``RUN_DIR/train.log`` (a launch
        from the console writes it so). On a node every trainer's process is visible: this one is the job's."""
        out = (state or {}).get("stdout") or ""
        return posixpath.dirname(out) if posixpath.isabs(out) and out.endswith("/train.log") else None


# squeue's fields (-O, no padding, "|" after each), one job a line: id, state, reason, time used, time
# left, time limit, nodes, output file (last: a path may hold "|")
FIELDS = "JobID:0|,State:0|,Reason:0|,TimeUsed:0|,TimeLeft:0|,TimeLimit:0|,NodeList:0|,STDOUT:0"
_ORDER = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "PENDING")


def parse_jobs(stdout: str, limit: int = 64) -> list[dict]:
    """squeue's lines (:data:`FIELDS`) as dicts; bounded, and a line of another shape skipped."""
    out = []
    for line in stdout.splitlines()[:limit]:
        parts = line.strip().split("|", 7)
        if len(parts) != 8 or not parts[0].strip().isdigit():
            continue
        job, state, reason, used, left, lim, nodes = (p.strip()[:200] for p in parts[:7])
        out.append(
            {
                "job": job,
                "state": state,
                "reason": "" if reason in ("None", "(null)") else reason,
                "used_s": duration_s(used),
                "left_s": duration_s(left),
                "limit_s": duration_s(lim),
                "nodes": nodes,
                "stdout": parts[7].strip()[:4096],
            }
        )
    return out


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
