"""Faults the tests inject into a trainer: pauses and full-disk failures of a save, failed metrics writes,
NaN steps, failing or hung trackers, the warm-up trace on the CPU.

The trainer reads none of this from its environment (docs/trust.md: no test hook in a production trainer). A
test that runs a trainer in another process puts ``FAULT_SITE`` on its PYTHONPATH (``trainer_run.env`` does
when it is given a ``DFLASH_TEST_*`` variable): the ``sitecustomize`` there runs ``install(os.environ)`` at
interpreter start, which patches each trainer module as it is imported. An in-process test calls the
``patch_*`` functions itself (with pytest's ``monkeypatch``).

The variables (read here only):

- ``DFLASH_TEST_PAUSE_AT=<stage>`` (``trainer.run.checkpoint.STAGES``): at that stage of save number
  ``DFLASH_TEST_PAUSE_SAVE`` (1-based, counting complete saves of the process + 1, default 1) print
  ``DFLASH_TEST_PAUSE <stage> <path>`` and sleep ``DFLASH_TEST_PAUSE_S`` seconds (default 3600), or until the
  path ``DFLASH_TEST_PAUSE_UNTIL`` exists;
- ``DFLASH_TEST_ENOSPC_SAVE=2,4``: those save attempts (1-based) fail as a full disk does: half of every
  payload file written, then ``OSError(ENOSPC)``;
- ``DFLASH_TEST_ENOSPC_METRICS=3,4``: those metrics.jsonl writes (1-based) fail the same way;
- ``DFLASH_TEST_NAN_STEPS=3,4``: those (1-based) steps' loss is NaN;
- ``DFLASH_TEST_TRACKER_RAISE=NAME:N[,NAME:open|close]``: that tracker's worker raises before its N-th batch,
  its open or its close; ``DFLASH_TEST_TRACKER_HANG=NAME``: it waits for ever before it opens;
- ``DFLASH_TEST_WARMUP=1``: the drafter's first step is traced on a stand-in batch on the CPU too.
"""

from __future__ import annotations

import errno
import importlib.abc
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

FAULT_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_site")


def _ints(value: str | None) -> set[int]:
    return {int(x) for x in (value or "").split(",") if x.strip()}


def _named(value: str | None) -> dict[str, str]:
    out = {}
    for item in (value or "").split(","):
        name, _, when = item.strip().partition(":")
        if name:
            out[name] = when
    return out


def save_hook(env: Mapping[str, str]) -> Callable[[str, str], None]:
    """``trainer.run.checkpoint.on_stage`` doing what ``env`` asks (pauses, failed save attempts)."""
    count = {"attempts": 0, "done": 0}
    enospc = _ints(env.get("DFLASH_TEST_ENOSPC_SAVE"))

    def on_stage(stage: str, path: str) -> None:
        if stage == "tmp_created":
            count["attempts"] += 1
        if stage == "files_written" and count["attempts"] in enospc:
            for d, _dirs, files in os.walk(path):
                for fn in files:
                    p = os.path.join(d, fn)
                    os.truncate(p, os.path.getsize(p) // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        if (
            env.get("DFLASH_TEST_PAUSE_AT") == stage
            and int(env.get("DFLASH_TEST_PAUSE_SAVE", "1")) == count["done"] + 1
        ):
            _pause(stage, path, env)
        if stage == "latest_written":
            count["done"] += 1

    return on_stage


def _pause(stage: str, path: str, env: Mapping[str, str]) -> None:
    print(f"DFLASH_TEST_PAUSE {stage} {path}", flush=True)
    deadline = time.monotonic() + float(env.get("DFLASH_TEST_PAUSE_S", "3600"))
    release = env.get("DFLASH_TEST_PAUSE_UNTIL")
    while time.monotonic() < deadline:  # short sleeps: the trainer's signal handlers run in between
        if release and os.path.exists(release):
            return
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class _HalfThenFull:
    """A raw file whose next write puts half its bytes down and then fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self):
        return self.f.fileno()


def patch_metrics(rundir, failing: set[int], setattr_=setattr) -> None:
    """Make those writes of ``rundir.MetricsWriter`` (1-based, counted over the process) fail with ENOSPC."""
    put = rundir.MetricsWriter._put
    count = [0]

    def _put(self, data, rec):
        count[0] += 1
        if count[0] not in failing:
            return put(self, data, rec)
        real, self._f = self._f, _HalfThenFull(self._f)
        try:
            return put(self, data, rec)
        finally:
            self._f = real

    setattr_(rundir.MetricsWriter, "_put", _put)


def patch_trackers(dispatcher, raise_at: Mapping[str, str], hang: set[str], setattr_=setattr) -> None:
    """Trackers that raise (``{name: N | "open" | "close"}``) or hang before they open (until the worker's
    ``hang_release`` event is set, which a test may set)."""

    def _check(self, when: str) -> None:
        if when == "open" and self.name in hang:
            self.__dict__.setdefault("hang_release", threading.Event()).wait()
        if raise_at.get(self.name) == when:
            raise RuntimeError(f"DFLASH_TEST_TRACKER_RAISE {self.name}:{when}")

    setattr_(dispatcher.Worker, "_check", _check)


def patch_nan(loop, steps: set[int], setattr_=setattr) -> None:
    setattr_(loop.Trainer, "poisoned", lambda self, step: step in steps)


def _patches(env: Mapping[str, str]) -> dict[str, Callable]:
    p: dict[str, Callable] = {}
    if any(k in env for k in ("DFLASH_TEST_PAUSE_AT", "DFLASH_TEST_ENOSPC_SAVE")):
        p["trainer.run.checkpoint"] = lambda m: setattr(m, "on_stage", save_hook(env))
    if "DFLASH_TEST_ENOSPC_METRICS" in env:
        p["trainer.run.rundir"] = lambda m: patch_metrics(m, _ints(env["DFLASH_TEST_ENOSPC_METRICS"]))
    if "DFLASH_TEST_NAN_STEPS" in env:
        p["trainer.runtime.loop"] = lambda m: patch_nan(m, _ints(env["DFLASH_TEST_NAN_STEPS"]))
    if any(k in env for k in ("DFLASH_TEST_TRACKER_RAISE", "DFLASH_TEST_TRACKER_HANG")):
        raise_at = _named(env.get("DFLASH_TEST_TRACKER_RAISE"))
        hang = set(_named(env.get("DFLASH_TEST_TRACKER_HANG")))
        p["trainer.tracking.dispatcher"] = lambda m: patch_trackers(m, raise_at, hang)
    if env.get("DFLASH_TEST_WARMUP") == "1":
        p["trainer.runtime.warmup"] = lambda m: setattr(m, "testing", lambda: True)
    return p


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after the module ``name`` is executed, whichever copy is imported."""

    def __init__(self, patches: dict[str, Callable]):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        spec = next((s for f in finders if (s := f.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run, patch = spec.loader.exec_module, self.patches[name]

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install(env: Mapping[str, str]) -> None:
    """Patch the trainer modules ``env`` names faults for, as each is imported (sitecustomize calls this)."""
    patches = _patches(env)
    if patches:
        sys.meta_path.insert(0, _PatchOnImport(patches))
