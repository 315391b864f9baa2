"""The launcher of the multi-process pipeline: the process the console signals, one worker per device.

``--launch multi``: spawns ``python -m trainer.worker --settings JSON`` (the run's resolved settings,
``trainer.run.settings.worker_argv``; never flags to parse again) once per device (targets first, then
drafters; ranks as in ``handoff.Layout``) with the torch.distributed environment on loopback
(``MASTER_ADDR=127.0.0.1``, ``GLOO_SOCKET_IFNAME=lo``; the rendezvous TCPStore is hosted by the launcher,
so it outlives any worker) and waits for them. ``--launch torchrun``: spawns
nothing; the workers, started by torchrun on every node (docs/trainer.md), connect to its control socket.
Every connection authenticates with the launch's secret (runtime/control_channel.py): the spawned workers
get it in their environment, torchrun's in ``RUN/control.secret`` (0600, removed at the end) or
``DFLASH_CONTROL_SECRET``; a connection that does not is dropped and logged, and the run goes on.

It owns run.json, metrics.jsonl and the stop protocol: a SIGINT/SIGTERM becomes ``stop_requested`` and a
``stop`` to every drafter; the drafters agree on the step to stop at, the saving drafter (replica 0)
writes the checkpoint (its events are relayed into metrics.jsonl), the targets are told to exit. A worker
that dies (or fails) is reported (``error`` event naming its rank, role and device, and in train.log); the
others are told to ``abort``: the lowest live drafter replica saves the last complete step, and whatever
has not exited ``ABORT_GRACE_S`` later is killed. Throughput records combine every worker's meter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from trainer.data.dataset import load_dir
from trainer.run import checkpoint
from trainer.run.settings import worker_argv
from trainer.run.startup import LAUNCH_ENV
from trainer.runtime import control_channel
from trainer.runtime.common import EXIT_ERROR, EXIT_OK, log
from trainer.runtime.handoff import Layout

ABORT_GRACE_S = 60.0


def local_store(tcp_store, timeout):
    """A master TCPStore listening on 127.0.0.1 only (torch's own listener takes every interface): it is handed
    a socket bound here, whose descriptor it then owns (and closes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        port = sock.getsockname()[1]
        store = tcp_store(
            "127.0.0.1",
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=timeout,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()
    return store


class RemoteMeter:
    """A worker's meter as the launcher's Reporter reads it (``take``), fed by ``meter`` messages."""

    def __init__(self, device: str, role: str, uuid: str | None, host: str | None = None):
        self.device, self.role, self.uuid = device, role, uuid
        self.host = host if isinstance(host, str) else None  # the worker's node (a run of several nodes)
        self._lock = threading.Lock()
        self._tokens, self._busy = 0, 0.0

    def add(self, tokens: int, busy: float) -> None:
        with self._lock:
            self._tokens += int(tokens)
            self._busy += float(busy)

    def take(self, now: float) -> tuple[int, float]:
        with self._lock:
            out = (self._tokens, self._busy)
            self._tokens, self._busy = 0, 0.0
        return out


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def torchrun_address(args) -> tuple[str, int]:
    """Where a ``--launch torchrun`` launcher listens: ``--control-host``/``--control-port``, or, where both are
    left at their defaults, ``DFLASH_CONTROL`` (HOST:PORT, the address its workers are given too: a Slurm job's
    batch script sets it, docs/runtimes.md), so that the run's own flags stay the same from start to start."""
    host, sep, port = os.environ.get("DFLASH_CONTROL", "").rpartition(":")
    if (args.control_host, args.control_port) != ("127.0.0.1", 0) or not (sep and host and port.isdigit()):
        return args.control_host, args.control_port
    return host, int(port)


EOF = "its control connection ended"


class Launcher:
    def __init__(self, args, devices, stop, writer, reporter, run_dir: str, resume_path: str | None):
        self.args, self.devices, self.stop = args, devices, stop
        self.writer, self.reporter, self.run_dir, self.resume_path = writer, reporter, run_dir, resume_path
        nnodes = args.nnodes if devices.mode == "torchrun" else 1
        self.layout = Layout(len(devices.target), len(devices.drafter), nnodes)
        self.procs: dict[int, subprocess.Popen] = {}
        self.info: dict[int, dict] = {}  # rank -> hello
        self.rank_of: dict[int, int] = {}  # conn id -> rank
        self.meters: dict[int, RemoteMeter] = {}
        self.depths: dict[int, tuple[int, int]] = {}
        self.exited: dict[
            int, int | None
        ] = {}  # rank -> exit status (None: connection ended, status unknown)
        self.results: dict[int, tuple[int, str]] = {}
        self.failures: list[tuple[int, int, str]] = []  # (rank, code, message)
        self.aborting_since: float | None = None
        self.stop_sent = False
        self.told_exit: set[int] = (
            set()
        )  # targets sent "exit" (the drafters are stopping): they leave at once
        self.exit_seen: dict[int, float] = {}

    # -- workers ---------------------------------------------------------------------------------------
    def spawn(self, server: control_channel.Server) -> None:
        from datetime import timedelta

        from torch.distributed import TCPStore

        # the rendezvous store lives here, not in rank 0: a target that exits first does not take it away
        self.store = local_store(TCPStore, timedelta(minutes=30))
        port = self.store.port
        L = self.layout
        argv = [sys.executable, "-m", "trainer.worker", *worker_argv(self.args)]
        for rank in range(L.world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(L.world),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(L.world),
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                DFLASH_CONTROL=f"127.0.0.1:{server.port}",
                DFLASH_CONTROL_SECRET=self.secret,  # the control socket's (runtime/control_channel.py)
                DFLASH_LAUNCHER_PID=str(os.getpid()),
                DFLASH_EXTERNAL_STORE="1",
            )
            if getattr(self, "startup", None) is not None:  # workers' elapsed_s count from this launch
                env[LAUNCH_ENV] = repr(self.startup.t0)
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
            self.procs[rank] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        log(
            f"launched {L.world} workers ({L.NT} target, {L.ND} drafter): pids "
            + " ".join(str(p.pid) for p in self.procs.values())
        )

    def who(self, rank: int) -> str:
        i = self.info.get(rank)
        if i is None:
            role, idx, _ = self.layout.role_of(rank)
            return f"rank {rank} ({role}{idx})"
        return f"rank {rank} ({i['role']}{i['index']} {i['device']}, pid {i['pid']})"

    def send(self, rank: int, op: str, **fields) -> None:
        cid = next((c for c, r in self.rank_of.items() if r == rank), None)
        if cid is not None and cid in self.server.channels:
            self.server.channels[cid].send(op, **fields)

    def connected(self, rank: int) -> bool:
        return any(r == rank and c in self.server.channels for c, r in self.rank_of.items())

    def alive(self, rank: int) -> bool:
        return rank not in self.exited

    def queue_stats(self) -> tuple[int, int]:
        d = [self.depths[r] for r in sorted(self.depths) if self.info.get(r, {}).get("role") == "drafter"]
        return sum(x[0] for x in d), self.layout.ND * self.args.hs_queue_depth

    # -- messages ------------------------------------------------------------------------------------------
    def handle(self, cid: int, msg: dict) -> None:
        op = msg.get("op")
        if op == "hello":
            rank = int(msg["rank"])
            self.rank_of[cid] = rank
            self.info[rank] = msg
            self.meters[rank] = RemoteMeter(msg["device"], msg["role"], msg.get("uuid"), msg.get("host"))
            if len(self.meters) == self.layout.world:  # throughput records list every worker, in rank order
                self.reporter.meters[:] = [self.meters[r] for r in sorted(self.meters)]
            welcome = {"resume": self.resume_path, "step": 0, "cursor": 0}
            if self.resume_path:
                man = checkpoint.read_manifest(self.resume_path)
                welcome.update(step=int(man["step"]), cursor=int(man["cursor"]))
            stop = self.stop_sent and msg["role"] == "drafter"
            self.server.channels[cid].send("welcome", stop=stop, **welcome)
            return
        rank = self.rank_of.get(cid)
        if rank is None:
            return
        if op == "uuid" and rank in self.meters:
            self.meters[rank].uuid = msg.get("uuid")
        elif op == "meter":
            self.meters[rank].add(msg.get("tokens", 0), msg.get("busy", 0.0))
            self.depths[rank] = (int(msg.get("depth", 0)), int(msg.get("capacity", 0)))
        elif op == "record":
            fields = msg.get("fields", {})
            if msg.get("kind") == "event":
                if fields.get("name") == "checkpoint_saving":
                    self.stop.saving = True
                elif fields.get("name") == "checkpoint_saved":
                    self.stop.saving = False
            self.stop.drain()  # a pending stop_requested goes out first
            self.writer.write(msg.get("kind", "event"), **fields)
        elif op == "stopping":
            for r in range(self.layout.world):
                if self.layout.role_of(r)[0] == "target":
                    self.told_exit.add(r)
                    self.send(r, "exit")
        elif op == "done":
            self.results[rank] = (int(msg.get("code", 0)), str(msg.get("reason", "finished")))
        elif op == "fatal":
            code, message = int(msg.get("code", EXIT_ERROR)), str(msg.get("message", ""))
            if not any(f[0] == rank for f in self.failures):
                self.failures.append((rank, code, message))
                print(f"error: {message}", file=sys.stderr, flush=True)
                self.writer.event("error", message=message, rank=rank)
                self.abort()
        elif op == "eof":
            self.server.channels.pop(cid, None)
            if self.devices.mode == "torchrun" and rank not in self.exited:
                self.exited[rank] = None
                self.check_death(rank, EOF)

    def check_death(self, rank: int, how: str) -> None:
        # a worker that reported its result did not die, nor a target told to exit whose connection ended
        # (torchrun's workers: their exit status is not this process's to see)
        ok = self.exited.get(rank) == 0 or rank in self.results or (rank in self.told_exit and how == EOF)
        if ok or any(f[0] == rank for f in self.failures):
            return
        message = f"worker {self.who(rank)} died: {how}"
        log(message)
        self.failures.append((rank, EXIT_ERROR, message))
        self.writer.event("error", message=message, rank=rank)
        self.abort()

    def abort(self) -> None:
        if self.aborting_since is not None:
            return
        self.aborting_since = time.monotonic()
        live = [d for d in range(self.layout.ND) if self.alive(self.layout.drafter_rank(d))]
        saver = live[0] if live else -1
        log("stopping the other workers" + (f"; drafter{saver} saves the last complete step" if live else ""))
        for r in range(self.layout.world):
            if self.alive(r):
                self.send(r, "abort", saver=saver)

    def forward_stop(self) -> None:
        if self.stop_sent or not self.stop.requested:
            return
        self.stop.drain()  # stop_requested is written before any worker hears of it
        self.stop_sent = True
        for r, i in self.info.items():
            if i["role"] == "drafter":
                self.send(r, "stop")

    # -- the run -------------------------------------------------------------------------------------------
    def run(self) -> tuple[int, str]:
        a = self.args
        torchrun = self.devices.mode == "torchrun"
        # torchrun's workers: DFLASH_CONTROL_SECRET where the operator set one (several nodes), else the file
        self.secret = (os.environ.get(control_channel.SECRET_ENV, "").strip() if torchrun else "") or (
            control_channel.new_secret()
        )
        secret_file = control_channel.write_secret_file(self.run_dir, self.secret) if torchrun else None
        host, port = torchrun_address(a) if torchrun else ("127.0.0.1", a.control_port)
        self.server = control_channel.Server(host, port, secret=self.secret, log=log)
        self.reporter.queue_stats = self.queue_stats
        try:
            if self.devices.mode == "multi":
                self.spawn(self.server)  # the workers start (imports, target load) while the data is checked
            # bad data fails here (exit 2; the workers are killed): read once here, not before the workers
            ds = load_dir(a.data_dir, a.max_seq_len)
            log(f"data: {len(ds)} sequences, {len(ds.tokens)} tokens from {len(ds.files)} file(s)")
            if self.devices.mode != "multi":
                log(
                    f"waiting for {self.layout.world} torchrun workers: control socket "
                    f"{self.server.host}:{self.server.port} (DFLASH_CONTROL for the workers; its secret in "
                    f"{secret_file}, or DFLASH_CONTROL_SECRET: docs/trainer.md)"
                )
            return self.loop()
        finally:
            self.kill_all()
            self.server.close()
            if secret_file is not None:
                with contextlib.suppress(OSError):
                    os.unlink(secret_file)

    def loop(self) -> tuple[int, str]:
        import queue

        world = self.layout.world
        while len(self.exited) < world:
            self.forward_stop()
            if self.devices.mode == "torchrun" and self.stop_sent and not self.info:
                log("stopped before any worker connected: nothing to save")
                return EXIT_OK, "signal"
            try:
                cid, msg = self.server.inbox.get(timeout=0.1)
                self.handle(cid, msg)
                while True:
                    cid, msg = self.server.inbox.get_nowait()
                    self.handle(cid, msg)
            except queue.Empty:
                pass
            now = time.monotonic()
            for rank, p in self.procs.items():
                if rank in self.exited or p.poll() is None:
                    continue
                # its last messages (a fatal error, say) may still be in flight: wait for the EOF, briefly
                since = self.exit_seen.setdefault(rank, now)
                if self.connected(rank) and now - since < 2.0:
                    continue
                self.drain_inbox()
                self.exited[rank] = p.returncode
                if p.returncode != 0:
                    self.check_death(rank, _describe_exit(p.returncode))
            if self.aborting_since is not None and time.monotonic() - self.aborting_since > ABORT_GRACE_S:
                log(f"workers still running {ABORT_GRACE_S:.0f}s after the abort: killing them")
                self.kill_all()
        self.drain_inbox()
        if self.failures:
            codes = {c for _, c, _ in self.failures}
            return (max(codes) if codes <= {2} else EXIT_ERROR), "error"
        saver = self.results.get(self.layout.drafter_rank(0))
        if saver is None:
            return EXIT_ERROR, "error"
        return saver if saver[0] != EXIT_OK else (EXIT_OK, saver[1])

    def drain_inbox(self) -> None:
        import queue

        try:
            while True:
                cid, msg = self.server.inbox.get_nowait()
                self.handle(cid, msg)
        except queue.Empty:
            return

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for rank, p in self.procs.items():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                pass
            if rank not in self.exited:
                self.exited[rank] = p.returncode
