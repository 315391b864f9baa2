"""What a restart would run on run.json's word alone: the reasons it needs its own confirmation.

A restart relaunches the interpreter, code directory, working directory and environment that run.json
names (restart_plan). Whoever can write the run directory can write run.json, so a restart
shows all of it first (``RestartPlan.lines``), and each of these needs a confirmation of its own
(``--trust-run-json`` in the CLI, a typed ``trust`` on the screen; ``--yes`` or ``y`` alone does not
cover it):

- the code directory is run.json's (not the operator's ``--code-dir`` or the last deployment)
  and is not one of the deployed code folders (``~/.dflash-console/code/HASH``, with its ``.complete``);
- PYTHONPATH holds another folder than the code directory;
- the interpreter is not the one the running trainer runs (``/proc/PID/exe``) or, with none running,
  not the one run.json's own ``command`` names;
- the working directory is neither the helper's home nor the code directory (``python -m`` imports from
  it first);
- an environment variable the trainer never records in run.json (``LD_PRELOAD``, ...), or one that
  changes what the trainer loads (``LD_LIBRARY_PATH``, ``PYTHON*``, ``PATH``: restart_env.py). Test hooks
  (``DFLASH_TEST_*``) are never passed on.
"""

from __future__ import annotations

import posixpath

from console.core.deploy import code_folder, deployed_base, is_deployed_path
from console.core.events import TrainerInfo
from console.core.helper import Helper, HelperError
from console.core.launching import RestartPlan
from console.core.restart_env import changes_what_loads

# the environment run.json records (mirrors trainer/run/rundir.py ENV_KEYS / ENV_PREFIXES)
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "HF_HOME",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_OFFLINE",
    "LD_LIBRARY_PATH",
    "PYTHONUNBUFFERED",
)
RECORDED_PREFIXES = ("NCCL_", "TORCH_", "DFLASH_")

# run by the helper's own interpreter: each path (a bare name looked up on PATH) resolved, "" if none
_REALPATHS = (
    "import os, shutil, sys\n"
    "for p in sys.argv[1:]:\n"
    "    w = p if os.sep in p else shutil.which(p)\n"
    "    print(os.path.realpath(w) if w and os.path.exists(w) else '')\n"
)


async def _realpaths(helper: Helper, paths: list[str]) -> list[str]:
    python = str(helper.hello.get("python") or "python3")
    try:
        r = await helper.run([python, "-c", _REALPATHS, *paths], timeout=30)
    except HelperError:
        return [""] * len(paths)
    out = r.get("stdout", "").split("\n") if r.get("rc") == 0 else []
    return [(out[i] if i < len(out) else "") for i in range(len(paths))]


async def _interpreter(
    helper: Helper, python: str, trainer: TrainerInfo | None, run: dict | None
) -> list[str]:
    if trainer is not None:
        ref, what = (
            [f"/proc/{trainer.pid}/exe", *trainer.cmdline[:1]],
            f"the running trainer (pid {trainer.pid})",
        )
    else:
        cmd = (run or {}).get("command")
        first = cmd[0] if isinstance(cmd, list) and cmd and isinstance(cmd[0], str) else None
        if first is None:
            return [f"the interpreter {python} cannot be checked: run.json has no command"]
        ref, what = [first], "run.json's command"
    mine, *theirs = await _realpaths(helper, [python, *ref])
    theirs = [t for t in theirs if t]
    if mine and theirs and mine == theirs[0]:
        return []
    seen = theirs[0] if theirs else "?"
    return [f"the interpreter {python} ({mine or 'not found'}) is not the one {what} runs ({seen})"]


async def _code(helper: Helper, plan: RestartPlan) -> list[str]:
    base = deployed_base(helper)
    out = []
    code = plan.code_dir
    if code and not plan.code_given:
        complete = is_deployed_path(code, base) and (
            await helper.stat(posixpath.join(code, ".complete"))
        ).get("exists")
        if not complete:
            out.append(f"the code directory {code} (run.json's) is not a deployed code folder ({base}/HASH)")
    for entry in (plan.env.get("PYTHONPATH") or "").split(":"):
        if entry and code_folder(entry) != code and not is_deployed_path(entry, base):
            out.append(f"PYTHONPATH also holds {entry}")
    return out


def _env(plan: RestartPlan) -> list[str]:
    out = []
    for k in sorted(plan.env):
        if k not in RECORDED_ENV and not k.startswith(RECORDED_PREFIXES):
            out.append(f"run.json's env sets {k}, which the trainer never records")
        elif changes_what_loads(k):
            out.append(f"run.json's env sets {k}={plan.env[k]}, which changes what the trainer loads")
    return out


def _cwd(helper: Helper, plan: RestartPlan) -> list[str]:
    """run.json's cwd is used only when it is the helper's home or the code directory: ``python -m``
    imports from its working directory first (a planted ``trainer/`` there would run)."""
    cwd = plan.cwd
    safe = {posixpath.normpath(p) for p in (helper.home, plan.code_dir) if p}
    if not cwd or posixpath.normpath(cwd) in safe:
        return []
    return [
        f"the working directory {cwd} (run.json's) is neither the home directory nor the code "
        "directory: python -m imports from it first"
    ]


async def restart_concerns(
    helper: Helper, plan: RestartPlan, trainer: TrainerInfo | None, run: dict | None
) -> list[str]:
    """Why ``plan`` needs its own confirmation ([] when run.json asks for nothing unusual)."""
    return [
        *await _code(helper, plan),
        *_cwd(helper, plan),
        *await _interpreter(helper, plan.python, trainer, run),
        *_env(plan),
    ]


async def prefill_concerns(
    helper: Helper, python: str | None, code_dir: str | None, run: dict | None
) -> list[str]:
    """Why the launch dialog's run.json prefill needs its own confirmation, by the restart's rules:
    ``python`` and ``code_dir`` are run.json's values (None: the operator's own or none)."""
    out = []
    if code_dir:
        base = deployed_base(helper)
        done = is_deployed_path(code_dir, base) and (
            await helper.stat(posixpath.join(code_dir, ".complete"))
        ).get("exists")
        if not done:
            out.append(
                f"the code directory {code_dir} (run.json's) is not a deployed code folder ({base}/HASH)"
            )
    if python:
        out += await _interpreter(helper, python, None, run)
    return out


def refusal(concerns: list[str]) -> str:
    """The message of a restart refused for ``concerns`` (nothing was stopped or launched)."""
    return (
        "not restarted, nothing was done: run.json asks for what needs its own confirmation: "
        + "; ".join(concerns)
        + " (CLI: --trust-run-json; screen: type trust)"
    )
