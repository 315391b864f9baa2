"""``dflash-console demo [--headless] [--dir DIR] [--port N]``: the whole system on this machine.

What runs, all on this machine and all ended when the demo ends:
- a DevHost (console/devhost): an asyncssh server on 127.0.0.1 with fresh keys (its known_hosts
  line written, host keys checked, only the demo's own client key accepted) whose ``pct`` stand-in
  plays container 200 as the folder ``DIR/host/ct/200``;
- the tiny target and data set, built once by ``python -m trainer.tiny`` in a subprocess (the
  console never imports torch);
- the bundled trainer, deployed and launched in the container through the console's own path
  (``Session.deploy``, ``Session.launch``), on CPU with one thread a role;
- the operator screen on a Session to that host; with ``--headless``, a status line a second.

Quitting (``q`` in the screen, Ctrl-C, SIGTERM) stops the trainer cleanly (SIGINT: checkpoint,
exit), closes the host and ends every process the demo started: they all carry the environment
variable ``DFLASH_DEMO=<token>``, and whatever still does at the end is ended. With ``--dir DIR``
the files stay and a rerun resumes the run from its last checkpoint; a temp dir is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from console.core import control
from console.core.events import ActionPhase, ConnState, Outcome, Record, TrainerFound
from console.core.metrics import headline_tok_s
from console.core.options import ConnectOptions
from console.core.session import Session
from console.devhost import DevHost

CT = 200
MARKER_ENV = "DFLASH_DEMO"
MARKER_FILE = ".dflash-demo"
TINY = "tiny"  # in the container
RUN = "runs/demo"  # in the container
STOP_TIMEOUT = 90.0
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


# --- processes the demo started -----------------------------------------------------------------------


def marked_processes(token: str) -> list[tuple[int, list[str]]]:
    """(pid, cmdline) of every live process whose environment carries ``DFLASH_DEMO=token``."""
    want = f"{MARKER_ENV}={token}".encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")[:-1]]
        except OSError:
            continue
        out.append((int(name), cmd))
    return out


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


async def _wait_gone(token: str, pids: set[int], timeout: float) -> set[int]:
    end = time.monotonic() + timeout
    left = pids
    while left and time.monotonic() < end:
        await asyncio.sleep(0.1)
        left = pids & {p for p, _ in marked_processes(token)}
    return left


async def end_marked(token: str, say: Say, trainer_wait: float = STOP_TIMEOUT) -> list[str]:
    """End what is left of the demo's processes: trainers get SIGINT (they save), the rest SIGTERM,
    then SIGKILL. Returns what had to be ended (empty when nothing was left)."""
    procs = marked_processes(token)
    if not procs:
        return []
    ended = [f"{pid} {' '.join(cmd)[:120]}" for pid, cmd in procs]
    trainers = {pid for pid, cmd in procs if control.is_trainer_cmdline(cmd)}
    for pid in trainers:
        say(f"trainer pid {pid} still running: SIGINT (it saves a checkpoint and exits)")
        _signal(pid, signal.SIGINT)
    if trainers:
        await _wait_gone(token, trainers, trainer_wait)
    rest = {p for p, _ in marked_processes(token)}
    for pid in rest:
        _signal(pid, signal.SIGTERM)
    rest = await _wait_gone(token, rest, 5.0)
    for pid in rest:
        say(f"pid {pid} did not end on SIGTERM: SIGKILL")
        _signal(pid, signal.SIGKILL)
    await _wait_gone(token, rest, 5.0)
    return ended


# --- the status line (headless) -----------------------------------------------------------------------


class StatusLine:
    """Folds session events into ``step, loss, accept_len, tok/s, queue`` (one line)."""

    def __init__(self) -> None:
        self.step: dict | None = None
        self.tok_s: float | None = None
        self.queue: dict | None = None
        self.stopped: dict | None = None
        self.trainer_seen = False
        self.trainer_gone = asyncio.Event()

    def on_event(self, ev: object) -> None:
        if isinstance(ev, Record):
            rec = ev.record
            kind = rec.get("kind")
            if kind == "step":
                self.step = rec
            elif kind == "throughput":
                self.tok_s = headline_tok_s(rec)
                q = rec.get("queue")
                self.queue = q if isinstance(q, dict) else None
            elif kind == "event" and rec.get("name") == "stopped":
                self.stopped = rec
        elif isinstance(ev, TrainerFound):
            if ev.trainer is not None:
                self.trainer_seen = True
                self.trainer_gone.clear()
            elif self.trainer_seen:
                self.trainer_gone.set()

    def line(self) -> str | None:
        if self.step is None and self.tok_s is None:
            return None
        s = self.step or {}

        def num(key: str, fmt: str) -> str:
            v = s.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else "-"

        step = f"{s['step']}/{s.get('total_steps', '?')}" if isinstance(s.get("step"), int) else "-"
        tok = f"{self.tok_s:.0f}" if self.tok_s is not None else "-"
        q = self.queue or {}
        queue = f"{q.get('depth', '?')}/{q.get('capacity', '?')}" if q else "-"
        return f"step {step}  loss {num('loss', '.3f')}  accept_len {num('accept_len', '.2f')}  tok/s {tok}  queue {queue}"


# --- the demo -----------------------------------------------------------------------------------------


def _missing_trainer_deps() -> list[str]:
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
        return Session(self.options(), ct=CT, run_dir=self.run_dir, **kw)

    @property
    def target(self) -> str:
        return f"demo · 127.0.0.1:{self.host.port} · CT {CT}" if self.host else "demo"

    def cli_hint(self) -> str:
        """The dflash-console flags that reach the demo's host from another terminal."""
        h = self.host
        return (
            f"dflash-console status {h.host} -p {h.port} -l {h.user} -i {h.client_key_path} "
            f"--known-hosts {h.known_hosts_path} -F /dev/null --ct {CT}"
        )

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
        code = str(control.bundled_trainer_dir().parent)
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
        session = Session(self.options(), ct=CT, run_dir=run_dir, streams=False, telemetry=False)
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


# --- the two modes ------------------------------------------------------------------------------------


def _printer(stream=None) -> Say:
    stream = stream or sys.stdout

    def say(msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            stream.write(msg + "\n")
            stream.flush()

    return say


def _on_signals(loop: asyncio.AbstractEventLoop, fn: Callable[[int], None], sigs) -> None:
    for sig in sigs:
        loop.add_signal_handler(sig, fn, sig)


def _off_signals(loop: asyncio.AbstractEventLoop, sigs) -> None:
    for sig in sigs:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)


async def _headless(demo: Demo) -> int:
    say = demo.say
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def on_signal(sig: int) -> None:
        if stop.is_set():
            say(f"{signal.Signals(sig).name}: already ending the demo, please wait")
        else:
            say(f"{signal.Signals(sig).name}: ending the demo")
        stop.set()

    _on_signals(loop, on_signal, sigs)
    status = StatusLine()
    session: Session | None = None
    setup: asyncio.Task | None = None
    ticker: asyncio.Task | None = None
    ok = True
    t0 = time.monotonic()
    try:
        await demo.start_host()
        say(f"demo host: 127.0.0.1:{demo.host.port}, container {CT} = {demo.ct_dir}")
        say(f"from another terminal: {demo.cli_hint()}")
        session = demo.session(telemetry=False)
        session.subscribe(status.on_event)
        await session.start()
        setup = loop.create_task(demo.setup(session, say))

        async def tick() -> None:
            while True:
                await asyncio.sleep(1.0)
                line = status.line()
                if line is not None:
                    m, s = divmod(int(time.monotonic() - t0), 60)
                    say(f"[{m:02d}:{s:02d}] {line}")

        ticker = loop.create_task(tick())
        waits = [loop.create_task(stop.wait()), loop.create_task(status.trainer_gone.wait()), setup]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            if t is not setup:
                t.cancel()
        if setup in done and setup.exception() is not None:
            exc = setup.exception()
            _printer(sys.stderr)(f"dflash-console demo: setup failed: {exc}")
            ok = False
        elif setup in done and not stop.is_set():
            # set up: now wait for a signal or for the trainer to end by itself
            gone = loop.create_task(status.trainer_gone.wait())
            halt = loop.create_task(stop.wait())
            await asyncio.wait([gone, halt], return_when=asyncio.FIRST_COMPLETED)
            gone.cancel()
            halt.cancel()
        if status.trainer_gone.is_set() and not stop.is_set():
            st = status.stopped or {}
            say(
                f"the trainer ended by itself ({st.get('reason', 'no stopped event')}, "
                f"exit code {st.get('exit_code', '?')}); ending the demo"
            )
            ok = ok and st.get("exit_code") == 0
    except DemoError as e:
        _printer(sys.stderr)(f"dflash-console demo: {e}")
        ok = False
    except Exception as e:  # said, not a traceback; the shutdown below still runs
        _printer(sys.stderr)(f"dflash-console demo: {type(e).__name__}: {e}")
        ok = False
    finally:
        for t in (setup, ticker):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        run_dir = session.run_dir if session is not None else None
        if session is not None:
            await session.close()
        clean = await demo.shutdown(run_dir, say)
        _off_signals(loop, sigs)
    say("demo ended; nothing of it is left running" if clean else "demo ended (see the messages above)")
    return 0 if ok and clean else 1


async def _screen(demo: Demo) -> int:
    from console.screens.demo_app import DemoApp

    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    app = None
    try:
        await demo.start_host()
        session = demo.session()
        app = DemoApp(demo, session)  # it takes SIGINT/SIGTERM/SIGHUP once mounted
        await app.run_async()
    except DemoError as e:
        _printer(sys.stderr)(f"dflash-console demo: {e}")
        return_code = 1
    else:
        return_code = 0 if app.setup_error is None else 1
        if app.setup_error is not None:
            _printer(sys.stderr)(f"dflash-console demo: setup failed: {app.setup_error}")
    finally:
        # Signals now mean "hurry": the shutdown below is what they would have asked for.
        _on_signals(loop, lambda sig: demo.say("already ending the demo, please wait"), sigs)
        run_dir = app.session.run_dir if app is not None else None
        for line in app.after if app is not None else []:
            demo.say(line)
        demo.say("ending the demo: closing the host, ending what it started")
        clean = await demo.shutdown(run_dir, demo.say)
        if app is not None and app.clean is not None:
            clean = clean and app.clean
        _off_signals(loop, sigs)
    demo.say("demo ended; nothing of it is left running" if clean else "demo ended (see the messages above)")
    return return_code if clean else 1


def run(args) -> int:
    """``dflash-console demo``: see the module docstring."""
    say = _printer()
    err = _printer(sys.stderr)
    missing = _missing_trainer_deps()
    if missing:
        err(
            f"dflash-console demo: the demo runs the trainer on this machine and needs {', '.join(missing)}, "
            f"which {sys.executable} lacks: {INSTALL_HINT}"
        )
        return 1
    if not args.headless and not (sys.stdout.isatty() and sys.stdin.isatty()):
        err(
            "dflash-console demo: the screen needs a terminal; use `dflash-console demo --headless` without one"
        )
        return 2
    if args.dir:
        root, temp = Path(args.dir).expanduser().resolve(), False
    else:
        root, temp = Path(tempfile.mkdtemp(prefix="dflash-demo-")), True
    demo = Demo(root, temp=temp, port=getattr(args, "port", 0) or 0, say=say)
    try:
        demo.claim_dir()
    except DemoError as e:
        err(f"dflash-console demo: {e}")
        if temp:
            shutil.rmtree(root, ignore_errors=True)
        return 1
    say(
        f"dflash-console demo in {root}"
        + (" (a temp dir, removed at the end; --dir keeps a run)" if temp else "")
    )
    try:
        code = asyncio.run(_headless(demo) if args.headless else _screen(demo))
    finally:
        demo.release_dir()
    if temp:
        say(f"removed the temp dir {root}")
    else:
        say(f"files kept in {root}; `dflash-console demo --dir {root}` resumes the run")
    return code
