"""The trainer's processes and threads, from the inside: the threads view (``t``) and ``dflash-console
threads``, headless.

The helper's ``threads`` op (console/core/helper_program/run_threads.py) reads, for the trainer (the pid and start
time the session knows, from run.json) and its descendants (its workers), every thread's
``/proc/PID/task/TID/stat``: tid, OS name (comm), state, utime + stime in clock ticks. One sample has no
rates: :class:`Sampler` keeps the previous sample and turns tick deltas into CPU% (ticks / SC_CLK_TCK /
seconds between the samples on the helper's clock; 100% is one core busy, as in ``top``). A thread is
matched across samples by pid, tid and start time, so a reused tid never makes a rate. A process that
exits between samples is said in :attr:`Snapshot.gone`. Everything here is bounded: the helper caps
processes and threads and says how many there were (:meth:`Snapshot.notes`); every string came
through the helper client's cleaning (sanitize.loads) and names are kept to one line here.

:func:`rows` is what both views show: one group row a process (busiest first), its threads under it
(busiest first); :func:`to_json` and :func:`format_text` are the CLI's.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from console.core.events import TrainerInfo
from console.core.formatting import fmt_duration
from console.core.sanitize import PLACEHOLDER

PREFIX = "dflash-"  # trainer/thread_names.py: a worker's main thread is dflash-target0, ...


class ThreadsError(Exception):
    """No sample: the trainer is not running (any more), or the helper's reply is not one."""


@dataclass(frozen=True)
class ThreadInfo:
    tid: int
    name: str  # the OS name (comm), one line
    state: str  # R running, S sleeping, D in the kernel, ...
    ticks: int  # utime + stime
    last_cpu: int  # the CPU it ran on last
    cpu_pct: float | None  # since the previous sample (None: no previous one)
    named: bool  # a name of its own, not its program's
    main: bool  # the process's main thread (tid == pid)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    start_time: int
    name: str
    role: str | None  # launcher | trainer | target0 | drafter1 | worker | None
    cmdline: str
    state: str
    ticks: int
    cpu_pct: float | None
    threads: tuple[ThreadInfo, ...]
    threads_total: int

    @property
    def label(self) -> str:
        return f"pid {self.pid}" + (f" ({self.role})" if self.role else "")


@dataclass(frozen=True)
class Snapshot:
    trainer_pid: int
    procs: tuple[ProcessInfo, ...]
    procs_total: int
    interval_s: float | None  # since the previous sample
    clk_tck: int
    ncpu: int | None
    gone: tuple[str, ...] = ()  # processes of the previous sample that have exited
    scan_capped: bool = False

    def notes(self) -> list[str]:
        """What the caps left out and what exited, said plainly."""
        out = [f"{p} exited since the last sample" for p in self.gone]
        if self.procs_total > len(self.procs):
            out.append(f"{len(self.procs)} of {self.procs_total} processes shown (capped)")
        if self.scan_capped:
            out.append("the process table was read in part (too many processes): children may be missing")
        for p in self.procs:
            if p.threads_total > len(p.threads):
                out.append(f"{p.label}: {len(p.threads)} of {p.threads_total} threads shown (capped)")
        return out

    def find(self, pid: int) -> ProcessInfo | None:
        return next((p for p in self.procs if p.pid == pid), None)


def one_line(text: str) -> str:
    """A name or command line on one line (tabs and newlines survive the cleaning; not here)."""
    return text.replace("\n", PLACEHOLDER).replace("\t", PLACEHOLDER).replace("\r", PLACEHOLDER)


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ThreadsError(f"the helper's threads reply is not one ({what}: {v!r:.40})")
    return v


def _str(v: object, what: str, limit: int = 300) -> str:
    if not isinstance(v, str):
        raise ThreadsError(f"the helper's threads reply is not one ({what}: {v!r:.40})")
    return one_line(v[:limit])


def role_of(pid: int, root: int, comm: str, cmdline: str, workers: bool) -> str | None:
    """What a process of the run is: the launcher (with workers) or the one-process trainer; a worker
    by its main thread's name (``dflash-target0``) or its command line; None for anything else."""
    if pid == root:
        return "launcher" if workers else "trainer"
    if comm.startswith(PREFIX) and len(comm) > len(PREFIX):
        return comm[len(PREFIX) :]
    if "trainer.worker" in cmdline:
        return "worker"
    if "trainer.evaluate" in cmdline:
        return "eval"
    return None


def program(cmdline: str) -> str:
    """The OS name a process gets from its program (``python3``), as the kernel cuts it."""
    first = cmdline.split(" ", 1)[0] if cmdline else ""
    return posixpath.basename(first)[:15]


class Sampler:
    """Successive samples of one run: each :meth:`feed` gives a :class:`Snapshot` with CPU% since the
    previous one."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the previous sample (the next one has no rates)."""
        self._t: float | None = None
        self._ticks: dict[tuple, int] = {}  # ticks of the previous sample, by process or thread
        self._next: dict[tuple, int] = {}  # ... and of the one being read
        self._labels: dict[tuple[int, int], str] = {}

    def feed(self, reply: object) -> Snapshot:
        """The snapshot of one ``threads`` reply; :class:`ThreadsError` for a trainer that is gone or a
        reply that is not one (nothing is kept from it)."""
        if not isinstance(reply, dict):
            raise ThreadsError("the helper's threads reply is not one")
        if reply.get("gone"):
            self.reset()
            raise ThreadsError(_str(reply.get("why") or "the trainer is not running", "why"))
        t, tck = reply.get("t"), _int(reply.get("clk_tck"), "clk_tck")
        if not isinstance(t, (int, float)) or tck <= 0 or not isinstance(reply.get("procs"), list):
            raise ThreadsError("the helper's threads reply is not one")
        dt = t - self._t if self._t is not None and t > self._t else None
        root = _int(reply.get("root"), "root")
        raw = [_proc_fields(p) for p in reply["procs"]]
        workers = any(p["pid"] != root and "trainer.worker" in p["cmdline"] for p in raw)
        self._next = {}
        procs = tuple(self._process(p, root, workers, dt, tck) for p in raw)
        gone = self._gone(procs)
        self._t = t
        self._ticks = self._next
        self._labels = {(p.pid, p.start_time): p.label for p in procs}
        return Snapshot(
            trainer_pid=root,
            procs=procs,
            procs_total=max(len(procs), _int(reply.get("procs_total", len(procs)), "procs_total")),
            interval_s=dt,
            clk_tck=tck,
            ncpu=reply.get("ncpu") if isinstance(reply.get("ncpu"), int) else None,
            gone=gone,
            scan_capped=bool(reply.get("scan_capped")),
        )

    def _rate(self, key: tuple, ticks: int, dt: float | None, tck: int) -> float | None:
        self._next[key] = ticks
        before = self._ticks.get(key)
        if dt is None or before is None or ticks < before:
            return None
        return (ticks - before) / tck / dt * 100.0

    def _process(self, p: dict, root: int, workers: bool, dt: float | None, tck: int) -> ProcessInfo:
        prog = program(p["cmdline"])
        threads = tuple(
            ThreadInfo(
                tid=tid,
                name=name,
                state=state,
                ticks=ticks,
                last_cpu=cpu,
                cpu_pct=self._rate(("t", p["pid"], tid, start), ticks, dt, tck),
                named=name != prog,
                main=tid == p["pid"],
            )
            for tid, name, state, ticks, cpu, start in p["threads"]
        )
        return ProcessInfo(
            pid=p["pid"],
            ppid=p["ppid"],
            start_time=p["start_time"],
            name=p["comm"],
            role=role_of(p["pid"], root, p["comm"], p["cmdline"], workers),
            cmdline=p["cmdline"],
            state=p["state"],
            ticks=p["ticks"],
            cpu_pct=self._rate(("p", p["pid"], p["start_time"]), p["ticks"], dt, tck),
            threads=threads,
            threads_total=max(len(threads), p["threads_total"]),
        )

    def _gone(self, procs: tuple[ProcessInfo, ...]) -> tuple[str, ...]:
        now = {(p.pid, p.start_time) for p in procs}
        return tuple(label for key, label in self._labels.items() if key not in now)


def _proc_fields(p: object) -> dict:
    """One process of the reply, checked: every field of the type it must have."""
    if not isinstance(p, dict) or not isinstance(p.get("threads"), list):
        raise ThreadsError("the helper's threads reply is not one (a process)")
    out = {k: _int(p.get(k), k) for k in ("pid", "ppid", "ticks", "start_time")}
    out.update({k: _str(p.get(k), k) for k in ("comm", "state", "cmdline")})
    out["threads_total"] = _int(p.get("threads_total", len(p["threads"])), "threads_total")
    out["threads"] = [_thread_fields(t) for t in p["threads"]]
    return out


def _thread_fields(t: object) -> tuple:
    if not isinstance(t, list) or len(t) != 6:
        raise ThreadsError("the helper's threads reply is not one (a thread)")
    tid, name, state, ticks, cpu, start = t
    return (
        _int(tid, "tid"),
        _str(name, "name", 64),
        _str(state, "state", 4),
        _int(ticks, "ticks"),
        _int(cpu, "cpu"),
        _int(start, "start"),
    )


async def sample(helper, trainer: TrainerInfo, run_dir: str | None = None) -> dict:
    """One ``threads`` reply for ``trainer`` (its pid and start time; the helper checks it still is)."""
    args = {"pid": trainer.pid, "start_time": trainer.start_time}
    if run_dir:
        args["run_dir"] = run_dir
    return await helper.call("threads", **args)


# --- what the views show ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: a process (a group row) or one of its threads."""

    key: str  # p<pid> | t<pid>:<tid> | m<pid> (the threads a limit left out)
    pid: int
    process: bool
    id: int  # pid or tid
    name: str
    state: str
    cpu_pct: float | None
    cpu_s: float
    info: str
    named: bool = True
    more: int = 0  # a row for the threads a limit left out: how many


def _order(percent: float | None) -> float:
    return -1.0 if percent is None else percent


def _thread_row(snap: Snapshot, p: ProcessInfo, t: ThreadInfo) -> Row:
    info = ("main thread, " if t.main else "") + f"last on CPU {t.last_cpu}"
    return Row(
        f"t{p.pid}:{t.tid}",
        p.pid,
        False,
        t.tid,
        t.name,
        t.state,
        t.cpu_pct,
        t.ticks / snap.clk_tck,
        info,
        t.named,
    )


def _more_row(snap: Snapshot, p: ProcessInfo, rest: list[ThreadInfo]) -> Row:
    """The threads a limit left out, in one row: how many, their CPU% and CPU time together."""
    percents = [t.cpu_pct for t in rest]
    percent = None if any(v is None for v in percents) else sum(percents)
    ticks = sum(t.ticks for t in rest)
    return Row(
        f"m{p.pid}",
        p.pid,
        False,
        0,
        f"… {len(rest)} more",
        "",
        percent,
        ticks / snap.clk_tck,
        "",
        False,
        len(rest),
    )


def rows(snap: Snapshot, limit: int | None = None) -> list[Row]:
    """Processes, busiest first, each followed by its threads, busiest first (then by tid); with
    ``limit``, a process's busiest ``limit`` threads and one row for the rest."""
    out: list[Row] = []
    for p in sorted(snap.procs, key=lambda p: (-_order(p.cpu_pct), p.pid)):
        shown = f"{len(p.threads)} of {p.threads_total}" if p.threads_total > len(p.threads) else ""
        info = f"{p.threads_total} threads{' (' + shown + ' shown)' if shown else ''}  {p.cmdline}"
        out.append(
            Row(f"p{p.pid}", p.pid, True, p.pid, p.name, p.state, p.cpu_pct, p.ticks / snap.clk_tck, info)
        )
        ts = sorted(p.threads, key=lambda t: (-_order(t.cpu_pct), t.tid))
        cut = limit is not None and len(ts) > limit + 1
        out += [_thread_row(snap, p, t) for t in (ts[:limit] if cut else ts)]
        if cut:
            out.append(_more_row(snap, p, ts[limit:]))
    return out


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def role_cell(snap: Snapshot, row: Row) -> str:
    if not row.process:
        return ""
    p = snap.find(row.pid)
    return (p.role or "") if p is not None else ""


def header(snap: Snapshot) -> str:
    """``trainer pid N: 3 processes, 41 threads; CPU% over 1.0 s (100% = one core of 16)``."""
    n = sum(len(p.threads) for p in snap.procs)
    over = f"CPU% over {snap.interval_s:.1f} s" if snap.interval_s else "CPU% from the next sample"
    cores = f" of {snap.ncpu}" if snap.ncpu else ""
    return (
        f"trainer pid {snap.trainer_pid}: {len(snap.procs)} process(es), {n} threads; "
        f"{over} (100% = one core{cores})"
    )


def format_text(snap: Snapshot) -> str:
    """The CLI's table: a process line, then its threads indented."""
    lines = [header(snap), f"{'PID/TID':>10}  {'ROLE':<10} {'NAME':<16} S {'CPU%':>7} {'TIME':>7}  INFO"]
    for r in rows(snap):
        ident = f"{r.id:>10}" if r.process else f"{'':>4}{r.id:>6}"
        lines.append(
            f"{ident}  {role_cell(snap, r):<10} {r.name:<16} {r.state:<1} {fmt_pct(r.cpu_pct):>7} "
            f"{fmt_duration(r.cpu_s):>7}  {r.info}"
        )
    lines += [f"note: {n}" for n in snap.notes()]
    return "\n".join(lines)


def to_json(snap: Snapshot) -> dict:
    """The CLI's ``--json``: every process and thread with its CPU% (null without a previous sample)."""
    tck = snap.clk_tck
    return {
        "trainer_pid": snap.trainer_pid,
        "interval_s": snap.interval_s,
        "clk_tck": tck,
        "ncpu": snap.ncpu,
        "processes_total": snap.procs_total,
        "notes": snap.notes(),
        "gone": list(snap.gone),
        "processes": [
            {
                "pid": p.pid,
                "ppid": p.ppid,
                "role": p.role,
                "name": p.name,
                "cmdline": p.cmdline,
                "state": p.state,
                "cpu_pct": p.cpu_pct,
                "cpu_s": p.ticks / tck,
                "threads_total": p.threads_total,
                "threads": [
                    {
                        "tid": t.tid,
                        "name": t.name,
                        "named": t.named,
                        "main": t.main,
                        "state": t.state,
                        "cpu_pct": t.cpu_pct,
                        "cpu_s": t.ticks / tck,
                        "last_cpu": t.last_cpu,
                    }
                    for t in p.threads
                ],
            }
            for p in snap.procs
        ],
    }
