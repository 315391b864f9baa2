"""Try the console by hand in a real runtime: ``python -m lab.runtime_tour KIND [DIR]``.

KIND is docker, podman, lxc or slurm. Starts that runtime the way the tests do (tests/support/runtimes/:
daemons of its own, nothing pulled; a container named ``train``, or a Slurm cluster of two nodes), a devhost
(SSH on 127.0.0.1) whose sessions see it, and a tiny target; prints the ``dflash-console`` arguments that
reach it and the trainer flags to launch there, then waits for Ctrl-C and stops everything it started.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.core_util import conn_args
from tests.support.devhost import devhost_thread
from tests.support.trainer_run import TRAINER_ENV, tiny_flags

KINDS = {"docker": "Docker", "podman": "Podman", "lxc": "Lxc", "slurm": "Slurm"}


def _runtime(kind: str, root: Path, run_root: Path):
    module = __import__(f"tests.support.runtimes.{kind}", fromlist=[KINDS[kind]])
    return getattr(module, KINDS[kind])(root, run_root)


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else ""
    if kind not in KINDS:
        sys.exit(f"usage: python -m lab.runtime_tour {{{','.join(KINDS)}}} [DIR]")
    base = Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="tour-")).resolve()
    tiny = base / "run-root" / "tiny"
    if not tiny.exists():
        subprocess.run([sys.executable, "-m", "trainer.tiny", str(tiny)], check=True)
    rt = _runtime(kind, base / "runtime", tiny.parent)
    try:
        place = ["--slurm", "dflash"] if kind == "slurm" else [f"--{kind}", rt.start("train")]
        with devhost_thread(base / "devhost", env={**TRAINER_ENV, **rt.env}) as h:
            print("connect:", shlex.join([*conn_args(h, ct=None), *place]))
            print("flags:", shlex.join(tiny_flags(tiny, tiny.parent / "run", "--epochs", "1000")))
            print("python:", sys.executable, flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    finally:
        rt.close()


def _interrupt(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    main()
