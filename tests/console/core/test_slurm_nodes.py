"""A Slurm launch of several nodes (console/core/places/slurm_nodes.py): the trainer's own flags decide it,
and the batch script it writes is valid sh that never lets a flag's value meet the shell's parser."""

from __future__ import annotations

import subprocess

from console.core.place import Slurm
from console.core.places.slurm_nodes import batch, flag, per_node

PY = ["/opt/py/bin/python", "-m", "trainer.pipeline"]


def test_only_torchrun_flags_make_a_job_of_several_nodes():
    assert batch([*PY, "--output-dir", "/r"]) is None
    assert batch([*PY, "--launch", "multi", "--nnodes", "2"]) is None
    assert batch(["python", "-m", "other", "--launch", "torchrun"]) is None
    assert batch([*PY, "--launch=torchrun", "--nnodes", "x"]) is None  # the trainer says what is wrong
    b = batch([*PY, "--launch", "torchrun", "--nnodes=3", "--target-gpus", "0,1,2", "--drafter-gpus", "3"])
    assert b.sbatch == ["--nodes=3", "--ntasks-per-node=1"]
    assert '--nproc-per-node="$k"' in b.script and "k=4" in b.script
    assert (flag(["--a", "1", "--a=2"], "--a"), flag(["--a"], "--a"), per_node([])) == ("2", None, 2)


def test_the_submitted_script_is_valid_sh_and_quotes_every_value(tmp_path):
    hostile = "/r/$(touch PWNED); `id` 'x\" y"
    argv = [*PY, "--output-dir", hostile, "--launch", "torchrun", "--nnodes", "2"]
    sbatch = Slurm("pair").submit(argv, log="/r/train.log", cwd="/r")
    assert "--nodes=2" in sbatch and "--signal=B:INT@120" in sbatch
    script = next(a for a in sbatch if a.startswith("--wrap="))[len("--wrap=") :]
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    # its first line sets the flags; run alone it gives them back exactly, nothing executed
    first = script.splitlines()[0] + '\nprintf "%s\\n" "$@"'
    r = subprocess.run(["sh", "-c", first], cwd=tmp_path, capture_output=True, text=True)
    assert r.stdout.splitlines() == argv[3:] and not (tmp_path / "PWNED").exists()
    assert (
        Slurm("one").submit([*PY, "--output-dir", "/r"], log="/r/l", cwd="/r")[-1].startswith("--wrap=exec ")
    )
