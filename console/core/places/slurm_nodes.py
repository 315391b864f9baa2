"""A run of several nodes as one Slurm job: the trainer's flags say ``--launch torchrun --nnodes N``.

The batch script runs on node 0. It picks two free ports on node 0's address (from ``scontrol show node``)
and a fresh ``DFLASH_CONTROL_SECRET``, starts the launcher there (its control socket on ``DFLASH_CONTROL``,
so that the run's flags stay as given, for a restart), and one ``torchrun`` per node as one job step
(``srun --nodes=N --ntasks-per-node=1``: node rank ``SLURM_NODEID``, ``--nproc-per-node`` = the flags'
target + drafter devices, the rendezvous on node 0) running ``trainer.worker`` with the run's flags. The
launcher is the process a stop signals; the batch shell passes ``--signal=B:INT@S`` on to it and ends with
its exit status once the workers' step has ended too (torchrun's agents leave through their exit barrier;
at most 10 s more). A workers' step that fails while the launcher runs sends it SIGTERM (a stop), so a run
whose workers never came does not wait for them forever (docs/runtimes.md "Several nodes").
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

PIPELINE = ("-m", "trainer.pipeline")

# Two free TCP ports on node 0's address (argv[1]): the launcher's control socket and torchrun's rendezvous.
_PORTS = (
    "import socket, sys\n"
    "s = [socket.socket() for _ in range(2)]\n"
    "[x.bind((sys.argv[1], 0)) for x in s]\n"
    "print(*[x.getsockname()[1] for x in s])"
)
_SECRET = "import secrets; print(secrets.token_hex(32))"
# One per node: torchrun with this node's rank, the workers' module and the run's flags.
_TORCHRUN = (
    'py=$1 n=$2 k=$3 addr=$4 port=$5; shift 5; exec "$py" -m torch.distributed.run --nnodes="$n" '
    '--node-rank="$SLURM_NODEID" --nproc-per-node="$k" --master-addr="$addr" --master-port="$port" '
    '-m trainer.worker "$@"'
)


@dataclass(frozen=True)
class Batch:
    sbatch: list[str]  # sbatch's options for the allocation
    script: str  # the batch script (``--wrap``)


def flag(flags: list[str], name: str) -> str | None:
    """The last value given to ``name`` (``--name V`` or ``--name=V``), None when absent."""
    value = None
    for i, tok in enumerate(flags):
        if tok == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif tok.startswith(name + "="):
            value = tok[len(name) + 1 :]
    return value


def per_node(flags: list[str]) -> int:
    """Workers a node runs: its target devices plus its drafter devices (the lists are per node)."""
    lists = (flag(flags, "--target-gpus") or "0", flag(flags, "--drafter-gpus") or "0")
    return sum(len([d for d in devices.split(",") if d.strip()]) for devices in lists)


def batch(argv: list[str]) -> Batch | None:
    """The job for ``argv`` (``PYTHON -m trainer.pipeline FLAGS``) when its flags ask for torchrun's
    workers; None for a run of one process tree (the batch script is then the trainer itself)."""
    if len(argv) < 3 or tuple(argv[1:3]) != PIPELINE or flag(argv[3:], "--launch") != "torchrun":
        return None
    python, flags = argv[0], argv[3:]
    nodes = flag(flags, "--nnodes") or "1"
    if not nodes.isdigit() or int(nodes) < 1:
        return None  # the trainer refuses it (exit 2) and says why
    q = shlex.quote
    script = "\n".join(
        [
            f"set -- {shlex.join(flags)}",
            f"py={q(python)} n={nodes} k={per_node(flags)}",
            'node0=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            'addr=$(scontrol show node "$node0" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)',
            "addr=${addr:-$node0}",
            f'ports=$("$py" -c {q(_PORTS)} "$addr")',
            "cport=${ports% *} mport=${ports#* }",
            'export DFLASH_CONTROL="$addr:$cport"',
            f'export DFLASH_CONTROL_SECRET=$("$py" -c {q(_SECRET)})',
            # the launcher (it listens on DFLASH_CONTROL: its flags stay the run's own, for a restart)
            f'"$py" {" ".join(PIPELINE)} "$@" & pid=$!',
            "trap 'kill -INT $pid 2>/dev/null' INT",  # --signal=B:INT@S reaches this shell: pass it on
            "trap 'kill -TERM $pid 2>/dev/null' TERM",
            f'{{ srun --nodes="$n" --ntasks="$n" --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c {q(_TORCHRUN)} '
            'sh "$py" "$n" "$k" "$addr" "$mport" "$@" || { s=$?; kill -0 $pid 2>/dev/null && { echo "dflash-console: '
            "the workers' step ended with exit $s: stopping the launcher\" >&2; kill -TERM $pid; }; }; } & step=$!",
            "while :; do wait $pid; rc=$?; kill -0 $pid 2>/dev/null || break; done",  # (a trap ends a wait)
            # torchrun's agents leave through their exit barrier: a moment for it, then the job ends
            "i=0; while kill -0 $step 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done",
            "exit $rc",
        ]
    )
    return Batch(["--nodes=" + nodes, "--ntasks-per-node=1"], script)
