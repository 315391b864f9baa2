"""Helpers for tests that run the real trainer (``python -m trainer.pipeline``) on the tiny target."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULT_SITE = str(Path(__file__).resolve().parent / "fault_site")  # tests/support/faults.py's sitecustomize


def env(**extra: str) -> dict[str, str]:
    """The environment of a trainer the tests start; given any ``DFLASH_TEST_*`` fault (tests/support/faults.py)
    it also gets the test-only ``sitecustomize`` that injects them (the trainer itself reads none)."""
    e = dict(os.environ)
    e.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    for k in [k for k in e if k.startswith("DFLASH_TEST_")]:
        del e[k]
    e.update(extra)
    if any(k.startswith("DFLASH_TEST_") for k in extra):
        e["PYTHONPATH"] = f"{e['PYTHONPATH']}:{FAULT_SITE}"
    return e


# the environment a devhost gives a real tiny trainer: one thread, quiet, offline
TRAINER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def tiny_flags(tiny: Path, out: Path, *extra: str) -> list[str]:
    """The small CPU configuration the tests (and the demo) use."""
    return [
        "--target-model",
        str(tiny / "target"),
        "--data-dir",
        str(tiny / "data"),
        "--output-dir",
        str(out),
        "--target-gpus",
        "cpu",
        "--drafter-gpus",
        "cpu",
        "--block-size",
        "8",
        "--max-anchors",
        "64",
        "--token-budget",
        "1024",
        "--max-seq-len",
        "256",
        "--lr",
        "1e-2",
        "--warmup-ratio",
        "0.02",
        *extra,
    ]


def dflash2_flags(steps: int) -> tuple[str, ...]:
    """A small DFlash 2 drafter (selector rank 8, top 4) trained ``steps`` steps with seed 3."""
    return (
        "--max-steps",
        str(steps),
        "--seed",
        "3",
        "--arch",
        "dflash2",
        "--selector-rank",
        "8",
        "--selector-top-k",
        "4",
    )


class Trainer:
    """A running trainer: stdout collected by a thread, started in its own session."""

    def __init__(self, flags: list[str], **env_extra: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.pipeline", *flags],
            cwd=ROOT,
            env=env(**env_extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, prefix: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for ln in list(self.lines):
                if ln.startswith(prefix):
                    return ln
            if self.proc.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no line starting {prefix!r}; output:\n{self.output}")

    def signal(self, sig: int = signal.SIGINT) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 90) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._t.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def run(flags: list[str], timeout: float = 120, **env_extra: str) -> tuple[int, str]:
    t = Trainer(flags, **env_extra)
    rc = t.wait(timeout)
    return rc, t.output


def run_in_process(flags: list[str], *, stop_after_step: int | None = None, **env_extra: str) -> int:
    """``trainer.pipeline.main(flags)`` in this process: its exit code (argparse's exit on bad flags too).

    No import of torch and transformers to pay: the variants of a flow that one test runs end to end in real
    processes (tests/trainer/test_pipeline_stop_resume.py) run here. Its output is not captured here (the
    test's ``capfd`` has it); ``env_extra`` is the run's environment beside the subprocesses' (``env()``).

    ``stop_after_step=k``: a real SIGINT, raised in this (the main) thread right after the run writes step
    k's record, goes to the trainer's own handler (trainer/run/stopping.py): the stop a signal asks for, at a
    known step (it stops after step k and saves it, as a run signalled during step k+1's wait would).

    What a run changes in the process is put back afterwards: the SIGINT/SIGTERM handlers, ``os.environ``
    (the compile cache's variables), ``sys.pycache_prefix``, the main thread's OS name, torch's global RNG,
    default dtype, deterministic-algorithms flags and thread count, Python's and NumPy's global RNGs; a thread it
    started that is still alive after 10 s fails the call.
    """
    import numpy as np
    import torch

    from trainer import pipeline
    from trainer.run import rundir

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    environ = dict(os.environ)
    pycache = sys.pycache_prefix
    comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm")
    os_name = comm.read_bytes().rstrip(b"\n") if comm.exists() else None
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    before = set(threading.enumerate())
    write = rundir.MetricsWriter.write
    e = env(**env_extra)
    del e["PYTHONPATH"]  # this process imports from the checkout already
    os.environ.clear()
    os.environ.update(e)

    def write_then_stop(self, kind, **fields):
        rec = write(self, kind, **fields)
        if kind == "step" and fields.get("step") == stop_after_step:
            signal.raise_signal(signal.SIGINT)
        return rec

    if stop_after_step is not None:
        rundir.MetricsWriter.write = write_then_stop
    try:
        try:
            return pipeline.main(list(flags))
        except SystemExit as ex:  # argparse: bad flags
            return ex.code if isinstance(ex.code, int) else 2
    finally:
        rundir.MetricsWriter.write = write
        for s, h in handlers.items():
            signal.signal(s, h)
        os.environ.clear()
        os.environ.update(environ)
        sys.pycache_prefix = pycache
        if os_name is not None:
            with contextlib.suppress(OSError):
                comm.write_bytes(os_name)
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        end = time.monotonic() + 10
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        for t in left:
            t.join(max(0.0, end - time.monotonic()))
        left = [t.name for t in left if t.is_alive()]
        if sys.exc_info()[0] is None:  # else that failure is the one to see
            assert not left, f"threads the in-process trainer left running: {left}"


def records(run_dir: Path) -> list[dict]:
    out = []
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def events(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if r.get("kind") == "event"]


def steps(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if r.get("kind") == "step"]


def wait_for_step(run_dir: Path, n: int, trainer: Trainer, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(r["step"] >= n for r in steps(run_dir)):
            return
        if trainer.proc.poll() is not None:
            raise AssertionError(f"trainer exited early:\n{trainer.output}")
        time.sleep(0.02)
    raise AssertionError(f"step {n} not reached:\n{trainer.output}")


def wait_for_record(run_dir: Path, what: str, pred, trainer: Trainer, timeout: float = 120) -> dict:
    """The first metrics.jsonl record for which ``pred`` holds, waiting for it (``what`` names it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for r in records(run_dir):
            if pred(r):
                return r
        if trainer.proc.poll() is not None:
            raise AssertionError(f"trainer exited before {what}:\n{trainer.output}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} in {timeout:.0f} s:\n{trainer.output}")


def session_members(sid: int) -> list[int]:
    """PIDs whose session id is ``sid`` (a trainer started with start_new_session leads its own)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[3]) == sid:  # field 6: session
            out.append(int(d))
    return out


def startup(run_dir: Path, **match) -> list[dict]:
    """The run's ``startup`` records (docs/run-directory.md), those with the given fields' values."""
    return [
        r
        for r in records(run_dir)
        if r.get("kind") == "startup" and all(r.get(k) == v for k, v in match.items())
    ]


def phases(recs: list[dict]) -> list[str]:
    """Their phases in order, repeats (loading progress) merged."""
    out: list[str] = []
    for r in recs:
        if not out or out[-1] != r["phase"]:
            out.append(r["phase"])
    return out


def run_script(*argv: str) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` from the repository root (a bench or lab script), asserting it exits 0."""
    r = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r
