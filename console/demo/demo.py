"""The Demo: its directory, its SSH host (console/devhost) playing container 200, the tiny target and
data, the trainer deployed and launched through a Session, and the shutdown that ends it all."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import secrets
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from console.core.deploy import bundled_trainer_dir
from console.core.events import ActionPhase, ConnState, Outcome
from console.core.options import ConnectOptions
from console.core.place import Proxmox
from console.core.session import Session
from console.demo.processes import MARKER_ENV, STOP_TIMEOUT, end_marked
from console.devhost import DevHost

CT = 200
HINT = "from another terminal:"
CLI_SCRIPT = "demo-cli"  # in the demo's directory: dflash-console with the demo host's flags
PLACE = Proxmox(CT)  # the devhost's container the demo's trainer lives in
MARKER_FILE = ".dflash-demo"
TINY = "tiny"  # in the container
RUN = "runs/demo"  # in the container
INSTALL_HINT = "install it with `pip install '.[trainer]'` (or run `make demo` in the source tree)"

# The trainer's flags in the demo (paths relative to the container's home, the trainer's cwd).
# A tiny drafter on CPU: ~3 steps/s; the acceptance-length estimate climbs from 0 to ~2 within
# two minutes at this learning rate (docs/demo.md). Many epochs: it trains until it is stopped,
# with a near-constant learning rate; a checkpoint every 200 steps besides the one at each stop.
TRAINER_FLAGS = [
    "--target-model",
    f"{TINY}/target",
    "--data-dir",
    f"{TINY}/data",
    "--output-dir",
    RUN,
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
    "0.001",
    "--epochs",
    "1000",
    "--save-every",
    "200",
    "--log-every",
    "5",
]
TRAINER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

Say = Callable[[str], None]


class DemoError(Exception):
    """The demo cannot start or run (said to the user as is)."""


# --- the demo -----------------------------------------------------------------------------------------


def missing_trainer_deps() -> list[str]:
    """The trainer's packages this interpreter lacks (looked up, not imported)."""
    return [m for m in ("torch", "transformers", "safetensors") if importlib.util.find_spec(m) is None]


class Demo:
    """Owns the demo's directory, host and processes; used by both the screen and --headless."""

    def __init__(self, root: Path, *, temp: bool, port: int = 0, say: Say = print) -> None:
        self.root = root
        self.temp = temp
        self.port = port
        self.say = say
        self.token = secrets.token_hex(8)
        self.host: DevHost | None = None
        self.host_root = root / "host"
        self.ct_dir = self.host_root / "ct" / str(CT)
        self.run_dir = str(self.ct_dir / RUN)
        self._lock_fd: int | None = None
        self._build: asyncio.subprocess.Process | None = None
        self._shutdown_lock = asyncio.Lock()

    # --- directory ---

    def claim_dir(self) -> None:
        """Create or check the demo directory and lock it (one demo per directory)."""
        root = self.root
        try:
            if root.exists() and not root.is_dir():
                raise DemoError(f"--dir {root}: exists and is not a directory")
            if root.is_dir() and any(root.iterdir()) and not (root / MARKER_FILE).exists():
                raise DemoError(
                    f"--dir {root}: not empty and not a demo directory (no {MARKER_FILE}); "
                    f"give a new or empty directory"
                )
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except PermissionError as e:
            raise DemoError(f"--dir {root}: {e.strerror} ({e.filename})") from e
        except OSError as e:
            raise DemoError(f"--dir {root}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise DemoError(
                f"another dflash-console demo is using {root}; end it first or give another --dir"
            ) from e
        self._lock_fd = fd
        marker = root / MARKER_FILE
        if not marker.exists():
            marker.write_text(json.dumps({"created": time.time()}) + "\n")

    def release_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.temp:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- host and session ---

    async def start_host(self) -> None:
        host = DevHost(self.host_root, port=self.port, env={MARKER_ENV: self.token})
        try:
            await host.start()
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise DemoError(
                    f"cannot listen on 127.0.0.1:{self.port}: the port is in use "
                    f"(leave --port out to take a free one)"
                ) from e
            raise DemoError(f"cannot start the local SSH host on 127.0.0.1:{self.port}: {e}") from e
        host.add_container(CT)
        self.host = host

    def options(self) -> ConnectOptions:
        h = self.host
        assert h is not None
        return ConnectOptions(
            host=h.host,
            port=h.port,
            user=h.user,
            identity_files=[str(h.client_key_path)],
            known_hosts=str(h.known_hosts_path),
            config_files=[],
        )

    def session(self, **kw) -> Session:
        return Session(self.options(), place=PLACE, run_dir=self.run_dir, **kw)

    @property
    def target(self) -> str:
        return PLACE.at(f"demo · 127.0.0.1:{self.host.port}") if self.host else "demo"

    def cli_hint(self) -> str:
        """How to reach the demo's trainer from another terminal: ``DIR/demo-cli COMMAND``, a script that
        runs ``dflash-console COMMAND`` with the demo host's flags (port, user, key, known_hosts, the
        container, the run dir: another trainer on the machine is then no question). One short line that
        pastes whole, where the flags themselves are wider than the screen."""
        h = self.host
        flags = [h.host, "-p", str(h.port), "-l", h.user, *PLACE.flags(), "--run-dir", self.run_dir]
        flags += ["-i", str(h.client_key_path), "--known-hosts", str(h.known_hosts_path), "-F", "/dev/null"]
        exe = Path(sys.executable).parent / "dflash-console"
        cli = str(exe) if exe.exists() else "dflash-console"
        script = self.root / CLI_SCRIPT
        script.write_text(
            "#!/bin/sh\n# dflash-console COMMAND [options] against the demo's host and run dir\n"
            f"cmd=${{1:?usage: {script} status|logs|stop|connect [options]}}; shift\n"
            f'exec {shlex.quote(cli)} "$cmd" {shlex.join(flags)} "$@"\n'
        )
        script.chmod(0o700)
        return f"{shlex.quote(str(script))} status   (or logs -f, stop, connect; the script holds the flags)"

    # --- setup: tiny assets, deploy, launch ---

    async def build_tiny(self, say: Say) -> None:
        """``python -m trainer.tiny`` into the container's ``tiny/`` (once; atomically)."""
        final = self.ct_dir / TINY
        if (final / "target" / "config.json").exists() and (final / "data" / "train.jsonl").exists():
            say(f"tiny target and data: {final} (built earlier)")
            return
        tmp = self.ct_dir / f".{TINY}-build"
        shutil.rmtree(tmp, ignore_errors=True)
        log = self.root / "tiny-build.log"
        say(f"building the tiny target and data set: python -m trainer.tiny (log: {log})")
        env = dict(
            os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **{MARKER_ENV: self.token}
        )
        code = str(bundled_trainer_dir().parent)
        env["PYTHONPATH"] = code + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        t0 = time.monotonic()
        with open(log, "ab") as logf:
            self._build = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "trainer.tiny",
                str(tmp),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=str(self.root),
                start_new_session=True,
            )
        try:
            rc = await self._build.wait()
        finally:
            if self._build.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._build.pid, signal.SIGKILL)
                await self._build.wait()
            self._build = None
        if rc != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            raise DemoError(
                f"python -m trainer.tiny failed (exit {rc}); last lines of {log}:\n" + "\n".join(tail)
            )
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        say(f"tiny target and data built in {time.monotonic() - t0:.0f} s")

    async def setup(self, session: Session, say: Say) -> None:
        """Everything after the connection: adopt a live trainer, or build, deploy and launch one."""
        # Wait for the "connected" state, which the session announces once its tails are attached too
        # (acting as soon as the helper is up would race the session's own set-up).
        connected = asyncio.Event()

        def on_event(ev: object) -> None:
            if isinstance(ev, ConnState) and ev.state == "connected":
                connected.set()

        unsubscribe = session.subscribe(on_event)
        try:
            await asyncio.wait_for(connected.wait(), 60)
        except asyncio.TimeoutError:
            raise DemoError("could not connect to the demo's own SSH host within 60 s") from None
        finally:
            unsubscribe()
        trainer = await session.find_trainer()
        if trainer is not None:
            say(f"a trainer from an earlier demo still runs here (pid {trainer.pid}): showing it")
            return
        await self.build_tiny(say)
        t0 = time.monotonic()
        code_dir = await session.deploy()
        say(f"deployed the bundled trainer to {code_dir} ({time.monotonic() - t0:.1f} s)")
        latest = self.ct_dir / RUN / "checkpoints" / "latest"
        if latest.exists():
            say(f"resuming from {latest.read_text().strip()} (--resume auto)")
        say("launching the trainer on CPU (it imports torch first: ~20 s)")
        res = await session.launch(TRAINER_FLAGS, code_dir=code_dir, env=dict(TRAINER_ENV), on_status=say)
        if res.code != Outcome.OK:
            raise DemoError(res.message)
        say(res.message)

    # --- shutdown ---

    async def shutdown(self, run_dir: str | None, say: Say) -> bool:
        """Stop the trainer cleanly, close the host, end whatever the demo started. True: all clean.
        Safe to call again (also while a first call runs: it waits for it)."""
        async with self._shutdown_lock:
            return await self._shutdown(run_dir, say)

    async def _shutdown(self, run_dir: str | None, say: Say) -> bool:
        clean = True
        if self._build is not None and self._build.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._build.pid, signal.SIGKILL)
        if self.host is not None:
            clean = await self._stop_trainer(run_dir or self.run_dir, say)
            await self.host.stop()
            self.host = None
        left = await end_marked(self.token, say)
        if left:
            say("ended what was left: " + "; ".join(left))
            clean = clean and all(" -m trainer.pipeline " not in f" {p} " for p in left)
        return clean

    async def _stop_trainer(self, run_dir: str, say: Say) -> bool:
        session = Session(self.options(), place=PLACE, run_dir=run_dir, streams=False, telemetry=False)
        try:
            await asyncio.wait_for(session.start(), 30)
        except Exception as e:  # the sweep after it still ends the trainer
            say(f"could not reach the demo host to stop the trainer ({e})")
            return False
        try:
            if session.trainer is None:
                return True
            tr = session.trainer
            say(f"stopping the trainer cleanly (pid {tr.pid}: SIGINT, checkpoint, exit)")

            def phase(p: ActionPhase) -> None:
                extra = f" (expected {p.expected_s:.1f} s)" if p.expected_s is not None else ""
                say(f"  [{p.phase}] {p.detail}{extra}")

            res = await session.stop_trainer(timeout=STOP_TIMEOUT, on_phase=phase)
            say(res.message)
            return res.code in (Outcome.OK, Outcome.NO_TRAINER)
        finally:
            await session.close()


def printer(stream=None) -> Say:
    stream = stream or sys.stdout

    def say(msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            stream.write(msg + "\n")
            stream.flush()

    return say


def on_signals(loop: asyncio.AbstractEventLoop, fn: Callable[[int], None], sigs) -> None:
    for sig in sigs:
        loop.add_signal_handler(sig, fn, sig)


def off_signals(loop: asyncio.AbstractEventLoop, sigs) -> None:
    for sig in sigs:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
