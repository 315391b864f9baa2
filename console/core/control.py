"""Trainer control through the helper: find, deploy, launch, stop cleanly, plan a restart and relaunch.

Every function takes a started :class:`~console.core.helper.Helper`; nothing here knows about
reconnects or the screen. Results say how an action ended (:class:`~console.core.events.Outcome`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import posixpath
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from console.core import helper_program
from console.core.events import ActionPhase, ActionResult, Outcome, TrainerInfo
from console.core.formatting import fmt_bytes
from console.core.helper import Helper, HelperError, HelperGone, b64encode
from console.core.metrics import MetricsParser
from console.core.phases import StopPhase
from console.core.streams import MAX_LINE, FileTail, clean_line

TRAINER_MODULE = helper_program.TRAINER_MODULE
USER_SCRIPT = helper_program.USER_SCRIPT
LAUNCHERS = helper_program.LAUNCHERS
CODE_HOME = ".dflash-console/code"
TAIL_MAX = 4 << 20  # `logs -n`: at most this much of the log's end is read

PhaseCallback = Callable[[ActionPhase], None]


class ControlError(Exception):
    """An operation could not be done; ``outcome`` says how it ended (the CLI's exit code follows)."""

    def __init__(self, message: str, outcome: Outcome = Outcome.ERROR) -> None:
        super().__init__(message)
        self.outcome = outcome


# --- command lines ----------------------------------------------------------------------------------


def is_trainer_cmdline(cmdline: list[str]) -> bool:
    """``python -m trainer.pipeline ...`` or ``python .../train_dflash_pipeline.py ...``: the helper's
    rule (``helper_program.is_trainer_cmdline``), the one every identity check applies."""
    return helper_program.is_trainer_cmdline(cmdline)


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` (the last one wins, as argparse does): the helper's reader."""
    return helper_program.flag_value(argv, name)


def set_flag(argv: list[str], name: str, value: str) -> list[str]:
    """``argv`` with every ``--name X`` / ``--name=X`` removed and ``--name value`` appended."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == name:
            skip = i + 1 < len(argv)
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    return [*out, name, value]


def resolve(path: str, cwd: str | None) -> str:
    if not posixpath.isabs(path) and cwd:
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path)


# --- find --------------------------------------------------------------------------------------------


async def read_run_json(helper: Helper, run_dir: str) -> dict | None:
    run = await helper.read_json(posixpath.join(run_dir, "run.json"))
    return run if isinstance(run, dict) else None


@dataclass
class Verdict:
    """The helper's answer to "is this PID still that trainer?" (``helper_program.identity``)."""

    state: str  # "same" | "gone" (not running, a zombie) | "other" (another process or program now)
    why: str  # why not, as the helper says it ("" when the same)
    proc: dict | None  # /proc/PID as the helper read it (None when there is none)
    owner: str = ""  # said when the same, as run.json's owner's and not the helper's user's process

    @property
    def same(self) -> bool:
        return self.state == "same"

    def ignores(self, sig: str) -> bool:
        """The process ignores ``sig`` (its /proc status ``SigIgn``, as the helper read it)."""
        ignored = (self.proc or {}).get("ignores")
        return isinstance(ignored, list) and sig in ignored

    def now_running(self) -> str:
        """What the PID is now, as a refusal says it: its command line and its owner."""
        proc = self.proc or {}
        cmd = proc.get("cmdline")
        text = shlex.join(str(a) for a in cmd)[:200] if isinstance(cmd, list) else "?"
        uid = proc.get("uid")
        return f"{text} (uid {uid})" if isinstance(uid, int) else text


def trainer_identity(trainer: TrainerInfo) -> dict:
    """What the trainer is known by, for the helper to check a PID against (``helper_program.identity``):
    a trainer at all (its command line is the trainer's; never PID 1 or the helper's own parents), its
    start time, its command line after argv[0], its owner (its effective uid must be the helper's own, or
    that of the owner of the run.json it was found through) and, found through run.json, its
    ``--output-dir`` must be that run directory."""
    from_run_json = trainer.source == "run.json" and bool(trainer.run_dir)
    run_json = posixpath.join(trainer.run_dir, "run.json") if from_run_json else None
    return {
        "trainer": True,
        "start_time": trainer.start_time,
        "argv_rest": list(trainer.cmdline[1:]),
        "owner": {"run_json": run_json},
        "run_dir": trainer.run_dir if from_run_json else None,
    }


async def identify(helper: Helper, trainer: TrainerInfo) -> Verdict:
    """Is ``trainer.pid`` still ``trainer``? Every check of find, stop, resume and restart asks this: the
    one rule lives in the helper (``helper_program.identity``), where /proc is read. An answer that is
    not one of the three verdicts counts as "other": never the trainer, never signalled."""
    r = await helper.call("identify", pid=trainer.pid, expect=trainer_identity(trainer))
    r = r if isinstance(r, dict) else {}
    proc = r.get("proc") if isinstance(r.get("proc"), dict) else None
    state = r.get("identity") if r.get("identity") in ("same", "gone", "other") else "other"
    if state == "same" and proc is None:
        state = "other"
    owner = str(r.get("owner") or "")[:200] if state == "same" else ""
    return Verdict(state, str(r.get("why") or "")[:200], proc, owner)


def _recorded(run: dict | None, run_dir: str | None) -> TrainerInfo | None:
    """The trainer run.json names (None without a pid). A start time or command that is not there
    never matches a process."""
    if not run or not isinstance(run.get("pid"), int):
        return None
    st = run.get("start_time")
    cmd = run.get("command")
    cmd = [str(a) for a in cmd] if isinstance(cmd, list) else []
    return TrainerInfo(run["pid"], st if isinstance(st, int) else -1, cmd, run_dir, "run.json", run)


def _found(v: Verdict, recorded: TrainerInfo) -> TrainerInfo:
    """``recorded`` as /proc shows it, once the helper said it is the same process."""
    proc = v.proc or {}
    cmd = proc.get("cmdline")
    return TrainerInfo(
        recorded.pid,
        recorded.start_time,
        [str(a) for a in cmd] if isinstance(cmd, list) else recorded.cmdline,
        recorded.run_dir,
        recorded.source,
        recorded.run,
    )


async def _candidates(helper: Helper, run_dir: str | None) -> list[tuple[dict, str | None]]:
    """Processes running ``trainer.pipeline`` / ``train_dflash_pipeline.py`` (of ``run_dir`` when given),
    the roots of launcher trees, oldest first; with their ``--output-dir`` resolved against their cwd."""
    cands = []
    for info in await helper.call("find", patterns=[TRAINER_MODULE, USER_SCRIPT]):
        if not is_trainer_cmdline(info["cmdline"]):
            continue
        out = flag_value(info["cmdline"], "--output-dir")
        rd = resolve(out, info.get("cwd")) if out else None
        if run_dir is not None and rd != posixpath.normpath(run_dir):
            continue
        cands.append((info, rd))
    pids = {c[0]["pid"] for c in cands}
    cands = [c for c in cands if c[0]["ppid"] not in pids]  # the root of a launcher tree
    return sorted(cands, key=lambda c: (c[0]["start_time"], c[0]["pid"]))


async def visible_trainers(helper: Helper) -> list[TrainerInfo]:
    """Every trainer process the helper sees (the roots of launcher trees, oldest first, by their
    command line): what a command without a run dir would choose among."""
    return [
        TrainerInfo(info["pid"], info["start_time"], info["cmdline"], rd, "cmdline", None)
        for info, rd in await _candidates(helper, None)
    ]


async def find_trainer(helper: Helper, run_dir: str | None) -> tuple[TrainerInfo | None, dict | None]:
    """The live trainer (of ``run_dir`` when given) and the run.json found, if any.

    run.json first (its pid must still be that trainer: :func:`identify`), else a process running
    ``trainer.pipeline`` / ``train_dflash_pipeline.py`` whose ``--output-dir`` (resolved against its
    own cwd) is ``run_dir``; without ``run_dir`` the oldest such process (that the helper also says is
    the trainer: its owner).
    """
    run = await read_run_json(helper, run_dir) if run_dir else None
    recorded = _recorded(run, run_dir)
    if recorded is not None:
        v = await identify(helper, recorded)
        if v.same:
            return _found(v, recorded), run
    for info, rd in await _candidates(helper, run_dir):
        crun = run if run is not None and rd == run_dir else (await read_run_json(helper, rd) if rd else None)
        named = _recorded(crun, rd)
        if named is not None and named.pid == info["pid"]:
            v = await identify(helper, named)
            if v.same:
                return _found(v, named), crun
        seen = TrainerInfo(info["pid"], info["start_time"], info["cmdline"], rd, "cmdline", None)
        if (await identify(helper, seen)).same:
            return seen, crun
    return None, run


async def stale_run_pid(helper: Helper, run: dict | None, run_dir: str | None = None) -> dict | None:
    """/proc info of run.json's pid when that pid runs but is not the recorded trainer (else None), with
    ``why`` (the helper's reason) and ``now`` (its command line and owner) added."""
    recorded = _recorded(run, run_dir)
    if recorded is None:
        return None
    v = await identify(helper, recorded)
    return {**v.proc, "why": v.why, "now": v.now_running()} if v.state == "other" and v.proc else None


# --- deploy ------------------------------------------------------------------------------------------


def bundled_trainer_dir() -> Path:
    """Where the bundled ``trainer`` package lies, found without importing it."""
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.submodule_search_locations:
        raise ControlError("the bundled trainer package is not installed next to the console")
    return Path(list(spec.submodule_search_locations)[0])


def bundled_trainer_files() -> tuple[str, list[tuple[str, bytes]]]:
    """(content hash, [(path relative to the code dir, bytes)]) of the bundled trainer package."""
    root = bundled_trainer_dir()
    files = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo"):
            continue
        files.append(("trainer/" + p.relative_to(root).as_posix(), p.read_bytes()))
    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16], files


def _is_hash(name: str) -> bool:
    return len(name) == 16 and all(c in "0123456789abcdef" for c in name)


def code_folder(path: str | None) -> str | None:
    """The code directory as the console names it everywhere: the folder that holds the ``trainer``
    package (what PYTHONPATH needs; a deploy's ``.../.dflash-console/code/HASH``). A deployed package
    folder itself (``.../.dflash-console/code/HASH/trainer``, what run.json's ``code_dir`` said before) is
    taken as its parent; any other path as it is (:func:`resolve_code_folder` looks in the container)."""
    if not path:
        return path
    p = posixpath.normpath(path)
    parent = posixpath.dirname(p)
    deployed = _is_hash(posixpath.basename(parent)) and posixpath.dirname(parent).endswith("/" + CODE_HOME)
    return parent if posixpath.basename(p) == "trainer" and deployed else p


async def resolve_code_folder(helper: Helper, path: str | None) -> str | None:
    """:func:`code_folder`, and a checkout's package folder (``X/trainer`` holding ``pipeline.py``, with
    no ``trainer/`` package of its own) taken as ``X`` too: it is never a PYTHONPATH entry of its own."""
    p = code_folder(path)
    if not p or posixpath.basename(p) != "trainer":
        return p
    package = (await helper.stat(posixpath.join(p, "pipeline.py"))).get("exists")
    nested = (await helper.stat(posixpath.join(p, "trainer", "pipeline.py"))).get("exists")
    return posixpath.dirname(p) if package and not nested else p


def deployed_base(helper: Helper) -> str:
    """The folder deploys write their code directories into (``~/.dflash-console/code``)."""
    return posixpath.join(helper.home, CODE_HOME)


def is_deployed_path(path: str, base: str) -> bool:
    """``path`` names one of ``base``'s deployed code directories (``base/HASH``, 16 hex digits)."""
    p = posixpath.normpath(path)
    name = posixpath.basename(p)
    return posixpath.dirname(p) == posixpath.normpath(base) and _is_hash(name)


PREFLIGHT = "import torch, transformers"
PREFLIGHT_TIMEOUT_S = 180.0
PYTHON_HINT = "give the container's interpreter that has them with --python PATH (e.g. a venv's bin/python)"


async def preflight(
    helper: Helper,
    python: str,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = PREFLIGHT_TIMEOUT_S,
) -> None:
    """Run ``python -c "import torch, transformers"`` in the container as the trainer would start (its
    env and cwd), at most ``timeout`` s: :class:`ControlError` naming ``--python`` when it fails."""
    what = f"`{python} -c '{PREFLIGHT}'`"
    try:
        r = await helper.run([python, "-c", PREFLIGHT], cwd=cwd, env=env, timeout=timeout)
    except HelperError as e:
        raise ControlError(f"cannot run {python} in the container ({e}); {PYTHON_HINT}") from e
    if r.get("timed_out"):
        raise ControlError(f"{what} did not finish within {timeout:.0f} s in the container; {PYTHON_HINT}")
    if r.get("rc") != 0:
        lines = (r.get("stderr") or r.get("stdout") or "").strip().splitlines()
        why = lines[-1] if lines else f"exit code {r.get('rc')}"
        raise ControlError(
            f"{python} in the container cannot run the trainer: {what} failed ({why}); {PYTHON_HINT}"
        )


async def deploy(helper: Helper, python: str = "python3", base: str | None = None, check: bool = True) -> str:
    """Copy the bundled trainer into ``~/.dflash-console/code/<hash>/`` and compile-check it there.

    The directory is named by content and written under a temporary name, then renamed: code that a
    running trainer imports is never written over. Returns the code dir (it contains ``trainer/``).
    With ``check`` it first runs :func:`preflight` with ``python`` (nothing is written when that fails).
    """
    if check:
        await preflight(helper, python)
    digest, files = bundled_trainer_files()
    base = base or deployed_base(helper)
    final = posixpath.join(base, digest)
    if (await helper.stat(posixpath.join(final, ".complete"))).get("exists"):
        return final
    tmp = posixpath.join(base, f".tmp-{digest}-{secrets.token_hex(4)}")
    try:
        await helper.call(
            "write_files", root=tmp, files=[{"path": rel, "data": b64encode(data)} for rel, data in files]
        )
        r = await helper.run([python, "-m", "compileall", "-q", posixpath.join(tmp, "trainer")], timeout=120)
        if r["rc"] != 0:
            raise ControlError(
                f"the deployed trainer does not compile with {python} in the container:\n"
                + (r["stdout"] + r["stderr"]).strip()[-2000:]
            )
        manifest = {"hash": digest, "files": [rel for rel, _ in files], "t": time.time()}
        await helper.call(
            "write", path=posixpath.join(tmp, ".complete"), data=b64encode(json.dumps(manifest).encode())
        )
        try:
            await helper.call("rename", src=tmp, dst=final)
        except HelperError:
            if not (await helper.stat(posixpath.join(final, ".complete"))).get("exists"):
                raise
    finally:
        with contextlib.suppress(HelperError, HelperGone):
            if (await helper.stat(tmp)).get("exists"):
                await helper.call("rmtree", path=tmp)
    return final


# --- reading the run's files ------------------------------------------------------------------------


async def file_size(helper: Helper, path: str) -> int:
    st = await helper.stat(path)
    return int(st["size"]) if st.get("exists") else 0


async def tail_lines(helper: Helper, path: str, n: int) -> list[str]:
    """The last ``n`` lines of a remote text file ([] when it is absent)."""
    return (await tail_lines_at(helper, path, n))[0]


async def tail_lines_at(helper: Helper, path: str, n: int, chunk: int = 1 << 16) -> tuple[list[str], int]:
    """(last ``n`` complete lines, the byte offset just after them): follow on from that offset."""
    try:
        data, start, _ = await helper.read(path, -chunk, chunk)
    except HelperError as e:
        if e.kind == "FileNotFoundError":
            return [], 0
        raise
    cut = data.rfind(b"\n") + 1  # a partial last line is left for the follower
    data = data[:cut]
    end = start + cut
    while data.count(b"\n") <= n and start > 0 and len(data) < TAIL_MAX:  # bounded: very long lines
        step = min(start, chunk * 4)
        more, start, _ = await helper.read(path, start - step, step)
        data = more + data
        chunk *= 4
    lines = [
        clean_line(ln[:MAX_LINE]) + (" …" if len(ln) > MAX_LINE else "") for ln in data.split(b"\n")[:-1]
    ]
    if start > 0:
        lines = lines[1:]  # the first one is cut
    return (lines[-n:] if n > 0 else []), end


async def recent_records(helper: Helper, run_dir: str, nbytes: int = 1 << 18) -> list[dict]:
    """Records from the last ``nbytes`` of metrics.jsonl (the first, cut line dropped)."""
    path = posixpath.join(run_dir, "metrics.jsonl")
    try:
        data, start, _ = await helper.read(path, -nbytes, nbytes)
    except HelperError as e:
        if e.kind == "FileNotFoundError":
            return []
        raise
    if start > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return MetricsParser().feed(data)


def _event_tail(path: str, offset: int) -> tuple[FileTail, asyncio.Queue[dict]]:
    """A tail of metrics.jsonl from ``offset`` and the queue its ``event`` records go to."""
    parser = MetricsParser()
    queue: asyncio.Queue[dict] = asyncio.Queue()

    def on_data(data: bytes) -> None:
        for rec in parser.feed(data):
            if rec.get("kind") in ("event", "startup"):  # startup: launch's progress (StopFollow ignores it)
                queue.put_nowait(rec)

    return FileTail(path, offset, on_data, interval=0.05), queue


# --- stop --------------------------------------------------------------------------------------------

SCAN_EVERY_S = 0.5  # a trainer without events: how often its --output-dir is looked at while it saves
REPORT_EVERY_S = 2.0  # ... and how often a growing file's new size is said


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _changed(before: dict, after: dict) -> dict[str, int]:
    """Files of ``after`` that are new or grew (or were rewritten) since ``before``: {relpath: size}."""
    out = {}
    for rel, (size, mtime) in after.items():
        old = before.get(rel)
        if old is None or size != old[0] or mtime != old[1]:
            out[rel] = size
    return out


def _describe(files: dict[str, int], limit: int = 6) -> str:
    names = sorted(files, key=lambda r: (-files[r], r))
    text = ", ".join(f"{r} ({fmt_bytes(files[r])})" for r in names[:limit])
    return text + (f" and {len(names) - limit} more" if len(names) > limit else "")


async def scan_dir(helper: Helper, path: str) -> dict:
    """{relpath: [size, mtime_ns]} of the files under ``path`` ({} when it is absent)."""
    r = await helper.call("scan", path=path)
    return dict(r.get("files") or {})


class StopFollow:
    """One clean stop, followed to the trainer's exit across dropped links.

    ``start(helper)`` verifies the PID, sends the one signal and follows the save; when the link drops
    it raises :class:`HelperGone` and keeps what it knows (the signal was sent, the metrics.jsonl
    offset, the events seen). ``resume(helper)`` on the next link re-identifies the trainer by PID and
    start time: still running, it follows on from the same offset (no second signal); gone, the outcome
    comes from the run directory (the events it wrote meanwhile, ``checkpoints/latest``).

    Every event the trainer wrote after the signal becomes a phase, in file order, however many arrive
    in one read (``stop_requested`` -> signal_sent, ``checkpoint_saving`` -> saving, ``checkpoint_saved``
    -> saved, ``error`` -> error), before ``exited``. A trainer without the run-directory contract (found
    by its command line) gets an open-ended ``saving`` phase that names the files appearing or growing
    in its ``--output-dir``.
    """

    def __init__(
        self,
        trainer: TrainerInfo,
        *,
        timeout: float = 120.0,
        on_phase: PhaseCallback | None = None,
        sig: str = "SIGINT",
    ) -> None:
        self.trainer = trainer
        self.timeout = timeout
        self.on_phase = on_phase
        self.sig = sig
        self.deadline = time.monotonic() + timeout
        self.signalled = False  # the signal was sent, or its request was under way when the link dropped
        self.t_signal: float | None = None
        self.has_events = False
        self.tail: FileTail | None = None
        self.parser = MetricsParser()
        self.saved: dict | None = None
        self.saving_seen = False
        self.errors: list[str] = []
        self.stopped: dict | None = None
        self.baseline: dict | None = None  # no events: the output dir's files before the signal
        self.written: dict[str, int] = {}
        self._said: tuple[list[str], str, float] = ([], "", 0.0)  # the files last named, when

    # -- phases --------------------------------------------------------------------------------------
    def phase(self, name: StopPhase, detail: str, expected: float | None = None) -> None:
        if self.on_phase is not None:
            self.on_phase(ActionPhase(name, detail, expected, time.time()))

    def _on_data(self, data: bytes) -> None:
        for rec in self.parser.feed(data):
            if rec.get("kind") == "event":
                self._event(rec)

    def _event(self, ev: dict) -> None:
        name = ev.get("name")
        if name == "stop_requested":
            self.phase(StopPhase.SIGNAL_SENT, f"trainer acknowledged {ev.get('signal') or self.sig}")
        elif name == "checkpoint_saving":
            self.saving_seen = True
            self.phase(
                StopPhase.SAVING, f"saving checkpoint at step {ev.get('step')}", _num(ev.get("expected_s"))
            )
        elif name == "checkpoint_saved":
            self.saved = ev
            secs = _num(ev.get("seconds"))
            self.phase(
                StopPhase.SAVED,
                f"checkpoint saved: {ev.get('path')}" + (f" ({secs:.1f} s)" if secs is not None else ""),
            )
        elif name == "error":
            self.errors.append(str(ev.get("message")))
            self.phase(StopPhase.ERROR, f"trainer reported an error: {ev.get('message')}")
        elif name == "stopped":
            self.stopped = ev

    # -- the first link: verify, signal, follow --------------------------------------------------------
    async def start(self, helper: Helper) -> ActionResult:
        trainer, pid, sig = self.trainer, self.trainer.pid, self.sig
        self.phase(StopPhase.VERIFYING, f"pid {pid}: checking /proc/{pid} still is the trainer")
        v = await identify(helper, trainer)
        if v.state == "gone":
            self.phase(StopPhase.EXITED, f"pid {pid} is not running")
            return ActionResult(Outcome.NO_TRAINER, f"no trainer: pid {pid} is not running", trainer)
        if not v.same:
            msg = (
                f"refused: pid {pid} is no longer the trainer ({v.why}; now running: {v.now_running()}); "
                "nothing was signalled"
            )
            self.phase(StopPhase.REFUSED, msg)
            return ActionResult(Outcome.REFUSED, msg, trainer)
        if v.owner:
            self.phase(StopPhase.VERIFYING, f"pid {pid} {v.owner}")
        if v.ignores(sig):
            return self._refuse_ignored(v)
        metrics = posixpath.join(trainer.run_dir, "metrics.jsonl") if trainer.run_dir else None
        self.has_events = trainer.source == "run.json" or bool(
            metrics and (await helper.stat(metrics)).get("exists")
        )
        if metrics and self.has_events:
            self.tail = FileTail(metrics, await file_size(helper, metrics), self._on_data, interval=0.05)
            self.tail.attach(helper)
        elif trainer.run_dir:
            self.baseline = await scan_dir(helper, trainer.run_dir)
        self.signalled = True  # from here on a dropped link never leads to a second signal
        sent = await helper.call("kill", pid=pid, sig=sig, expect=trainer_identity(trainer))
        if not sent["sent"]:
            self.signalled = False
            if self.tail is not None:
                await self.tail.detach()
            if sent["reason"] == "mismatch":
                why = str(sent.get("why") or "")[:200]  # changed between the check and the signal
                because = f" ({why})" if why else ""
                msg = f"refused: pid {pid} is no longer the trainer{because}; nothing was signalled"
                self.phase(StopPhase.REFUSED, msg)
                return ActionResult(Outcome.REFUSED, msg, trainer)
            self.phase(StopPhase.EXITED, f"pid {pid} exited before the signal")
            return ActionResult(
                Outcome.NO_TRAINER, f"no trainer: pid {pid} exited before the signal", trainer
            )
        self.t_signal = time.time()
        self.phase(StopPhase.SIGNAL_SENT, f"{sig} sent to pid {pid}")
        if not self.has_events:
            where = (
                f"; watching {trainer.run_dir} for new or growing files" if self.baseline is not None else ""
            )
            self.phase(
                StopPhase.SAVING,
                f"waiting for pid {pid} to save and exit (it reports no progress events){where}",
            )
        return await self._follow(helper)

    # -- a later link ----------------------------------------------------------------------------------
    async def resume(self, helper: Helper) -> ActionResult:
        """Go on after a reconnect (only once ``signalled``): follow a live trainer or read the outcome."""
        tr, pid = self.trainer, self.trainer.pid
        if (await identify(helper, tr)).same:
            self.phase(
                StopPhase.RECONNECTED,
                f"link back: pid {pid} (start time {tr.start_time}) is still the trainer; following its save "
                f"(not signalled again)",
            )
            if self.tail is not None:
                self.tail.attach(helper)
            return await self._follow(helper)
        self.phase(
            StopPhase.RECONNECTED,
            f"link back: pid {pid} exited while the link was down; reading the run directory",
        )
        if self.tail is not None:
            await self.tail.drain(helper)
        return await self._conclude(helper, {"rc": None}, offline=True)

    # -- following -----------------------------------------------------------------------------------
    async def _follow(self, helper: Helper) -> ActionResult:
        pid = self.trainer.pid
        waiter = asyncio.ensure_future(helper.call("wait_exit", pid=pid, start_time=self.trainer.start_time))
        try:
            while True:
                left = self.deadline - time.monotonic()
                step = min(left, SCAN_EVERY_S) if self.baseline is not None else left
                await asyncio.wait([waiter], timeout=max(0.0, step))
                if waiter.done():
                    exit_info = waiter.result()  # HelperGone when the link dropped: resume() goes on
                    if self.tail is not None:
                        await self.tail.drain()
                    return await self._conclude(helper, exit_info)
                if self.baseline is not None:
                    await self._report_files(helper)
                if time.monotonic() >= self.deadline:
                    return self._timeout()
        finally:
            if not waiter.done():
                waiter.cancel()
            if self.tail is not None:
                await self.tail.detach()

    async def _report_files(self, helper: Helper, final: bool = False) -> None:
        self.written = _changed(self.baseline or {}, await scan_dir(helper, self.trainer.run_dir))
        if not self.written or final:
            return
        text, names, now = _describe(self.written), sorted(self.written), time.monotonic()
        said_names, said_text, said_t = self._said
        if names != said_names or (text != said_text and now - said_t >= REPORT_EVERY_S):
            self._said = (names, text, now)  # a new file at once; a growing one every few seconds
            self.phase(StopPhase.SAVING, f"writing in {self.trainer.run_dir}: {text}")

    def _refuse_ignored(self, v: Verdict) -> ActionResult:
        """The trainer ignores the stop's signal: sending it would only start a wait for the timeout."""
        pid, sig = self.trainer.pid, self.sig
        other = "SIGTERM" if sig == "SIGINT" else "SIGINT"
        msg = (
            f"refused: pid {pid} ignores {sig} (SigIgn in /proc/{pid}/status), so it cannot stop cleanly; "
            f"nothing was signalled. A Python program started in the background by a script (`nohup ... &`) "
            f"inherits SIGINT ignored, and its KeyboardInterrupt never comes; a run the console launches does not. "
            + ("" if v.ignores(other) else f"If it saves on {other}: `kill -{other[3:]} {pid}`; ")
            + f"`kill -KILL {pid}` inside the container ends it without a save."
        )
        self.phase(StopPhase.REFUSED, msg)
        return ActionResult(Outcome.REFUSED, msg, self.trainer)

    def _timeout(self) -> ActionResult:
        pid = self.trainer.pid
        what = "still saving" if self.saving_seen and self.saved is None else "still running"
        msg = (
            f"timeout after {self.timeout:.0f} s: pid {pid} is {what} and was left running. "
            f"Wait and check with `status`, run `stop` again with a longer --timeout, or (losing the "
            f"save in progress; checkpoints/latest keeps the last complete one) `kill -KILL {pid}` "
            f"inside the container."
        )
        self.phase(StopPhase.TIMEOUT, msg)
        return ActionResult(Outcome.STILL_RUNNING, msg, self.trainer)

    async def _latest(self, helper: Helper) -> str | None:
        if not self.trainer.run_dir:
            return None
        try:
            data, _, _ = await helper.read(
                posixpath.join(self.trainer.run_dir, "checkpoints", "latest"), 0, 4096
            )
        except HelperError:
            return None
        name = data.decode("utf-8", "replace").strip()
        return posixpath.join(self.trainer.run_dir, "checkpoints", name) if name else None

    async def _conclude(self, helper: Helper, exit_info: dict, offline: bool = False) -> ActionResult:
        tr, pid = self.trainer, self.trainer.pid
        rc = exit_info.get("rc")
        if rc is None and self.stopped is not None and isinstance(self.stopped.get("exit_code"), int):
            rc = self.stopped["exit_code"]
        rc_s = f", exit code {rc}" if rc is not None else ""
        when = (
            "while the link was down"
            if offline
            else f"{time.time() - (self.t_signal or time.time()):.1f} s after the signal"
        )
        src = " (from the run directory)" if offline else ""
        if not self.has_events:
            if self.baseline is not None:
                await self._report_files(helper, final=True)
            if self.written and rc in (0, None):
                self.phase(StopPhase.SAVED, f"wrote {_describe(self.written)}")
                self.phase(StopPhase.EXITED, f"pid {pid} exited {when}{rc_s}")
                note = (
                    ""
                    if rc is not None
                    else " (its exit status is not visible: it is not the helper's child)"
                )
                return ActionResult(
                    Outcome.OK,
                    f"stopped: pid {pid} exited{rc_s}{note} after writing in {tr.run_dir}: {_describe(self.written)}",
                    tr,
                )
            if self.written:
                what = f"after writing {_describe(self.written)}, but with exit code {rc}"
            elif self.baseline is None:
                what = "(its output directory is unknown: nothing to check)" + (
                    f"{rc_s}" if rc is not None else ""
                )
            else:
                what = f"without writing anything new in {tr.run_dir}{rc_s}"
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when} {what}")
            return ActionResult(Outcome.NO_CHECKPOINT, f"pid {pid} exited {what}", tr)
        if self.saved is not None:
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when}{rc_s}")
            msg = (
                f"stopped{' while the link was down' if offline else ''}: checkpoint "
                f"{self.saved.get('path')} saved (step {self.saved.get('step')}); pid {pid} exited{rc_s}{src}"
            )
            return ActionResult(Outcome.OK, msg, tr, self.saved.get("path"))
        latest = await self._latest(helper)
        keeps = (
            f"; checkpoints/latest still names {latest}" if latest else "; there is no complete checkpoint"
        )
        failed = (self.stopped or {}).get("reason") == "checkpoint_failed" or (
            self.saving_seen and bool(self.errors)
        )
        if failed:
            err = self.errors[-1] if self.errors else "the save did not complete"
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when}: checkpoint failed{rc_s}")
            return ActionResult(
                Outcome.NO_CHECKPOINT, f"checkpoint failed: {err}; pid {pid} exited{rc_s}{src}{keeps}", tr
            )
        self.phase(StopPhase.EXITED, f"pid {pid} exited {when} without saving a checkpoint{rc_s}")
        return ActionResult(
            Outcome.NO_CHECKPOINT, f"pid {pid} exited without checkpoint_saved{rc_s}{src}{keeps}", tr
        )


async def stop(
    helper: Helper,
    trainer: TrainerInfo,
    *,
    timeout: float = 120.0,
    on_phase: PhaseCallback | None = None,
    sig: str = "SIGINT",
) -> ActionResult:
    """Stop the trainer cleanly on this one link (see :class:`StopFollow`; ``Session.stop_trainer``
    also goes on across reconnects)."""
    return await StopFollow(trainer, timeout=timeout, on_phase=on_phase, sig=sig).start(helper)


# --- launch / restart ------------------------------------------------------------------------------


def pythonpath(code_dir: str, recorded: str | None, *old_code_dirs: str | None) -> str:
    """PYTHONPATH with ``code_dir`` first, the recorded entries after it (the old code dir removed, as
    each of ``old_code_dirs`` names it)."""
    drop = {posixpath.normpath(d) for d in (code_dir, *old_code_dirs) if d}
    parts = [p for p in (recorded or "").split(":") if p and posixpath.normpath(p) not in drop]
    return ":".join([code_dir, *parts])


def _launch_dir(flags: list[str], run_dir: str | None, cwd: str) -> tuple[list[str], str]:
    """(the flags, with ``--output-dir`` added when only ``run_dir`` names it; the run dir, resolved)."""
    out = flag_value(flags, "--output-dir")
    if out is None and run_dir is None:
        raise ControlError("no run dir: give --output-dir in the trainer flags (or --run-dir)", Outcome.USAGE)
    if out is None:
        flags = [*flags, "--output-dir", run_dir]
        out = run_dir
    rd = resolve(out, cwd)
    if run_dir is not None and resolve(run_dir, cwd) != rd:
        raise ControlError(
            f"--run-dir {run_dir!r} and the trainer's --output-dir {out!r} differ", Outcome.USAGE
        )
    return flags, rd


async def launch(
    helper: Helper,
    flags: list[str],
    *,
    run_dir: str | None = None,
    python: str = "python3",
    code_dir: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    wait_s: float = 300.0,
    on_status: Callable[[str], None] | None = None,
    on_startup: Callable[[dict], None] | None = None,
    check: bool = True,
) -> ActionResult:
    """Start ``python -m trainer.pipeline FLAGS`` detached and wait for its ``started`` event.

    ``code_dir`` is the folder that holds the ``trainer`` package (:func:`code_folder`); without it the
    bundled trainer is deployed. With ``check`` it first runs :func:`preflight` with the launch's
    interpreter, env and cwd (a restart that ran it before stopping passes ``check=False``).

    With ``on_startup``, it waits on for the ``first_step`` event instead, and hands every start-up record
    (``started``, ``startup``, ``first_step``; docs/run-directory.md) to it as it arrives: a trainer that
    exits before its first step is then an error too.

    Refuses (code 1) when a live trainer owns the run dir; on an early exit the message holds the
    tail of train.log. ``run_dir`` defaults to the flags' ``--output-dir``; when both are given they
    must name the same directory (code 2 otherwise).
    """
    say = on_status or (lambda s: None)
    cwd = cwd or helper.home
    flags, rd = _launch_dir(list(flags), run_dir, cwd)
    live, _ = await find_trainer(helper, rd)
    if live is not None:
        raise ControlError(f"refused: a live trainer (pid {live.pid}) owns {rd}; stop it first")
    env = dict(env or {})
    code_dir = await resolve_code_folder(helper, code_dir)
    if check:
        pre = {**env, "PYTHONPATH": pythonpath(code_dir, env.get("PYTHONPATH"))} if code_dir else env
        await preflight(helper, python, env=pre, cwd=cwd)
    if code_dir is None:
        say("deploying the bundled trainer")
        code_dir = await deploy(helper, python, check=False)
    env["PYTHONPATH"] = pythonpath(code_dir, env.get("PYTHONPATH"))
    env.setdefault("PYTHONUNBUFFERED", "1")
    metrics = posixpath.join(rd, "metrics.jsonl")
    log = posixpath.join(rd, "train.log")
    await helper.call("mkdir", path=rd)
    follower, events = _event_tail(metrics, await file_size(helper, metrics))
    argv = [python, "-m", TRAINER_MODULE, *flags]
    say(f"starting {shlex.join(argv)}")
    sp = await helper.call("spawn", argv=argv, cwd=cwd, env=env, log=log)
    pid = int(sp["pid"])
    follower.attach(helper)
    # the spawned process itself (pid + start time): its command line may still change (an interpreter shim)
    waiter = asyncio.ensure_future(helper.call("wait_exit", pid=pid, start_time=sp.get("start_time")))
    try:
        await _await_start(helper, pid, waiter, follower, events, log, wait_s, on_startup, say)
    finally:
        if not waiter.done():
            waiter.cancel()
        await follower.detach()
    trainer, _ = await find_trainer(helper, rd)
    if trainer is None:
        info = await helper.proc(pid)
        trainer = TrainerInfo(
            pid, int(sp.get("start_time") or 0), (info or {}).get("cmdline", argv), rd, "cmdline", None
        )
    return ActionResult(Outcome.OK, f"launched pid {pid} in {rd} (code {code_dir})", trainer)


async def _await_start(
    helper: Helper,
    pid: int,
    waiter: asyncio.Future,
    follower: FileTail,
    events: asyncio.Queue[dict],
    log: str,
    wait_s: float,
    on_startup: Callable[[dict], None] | None,
    say: Callable[[str], None],
) -> None:
    """Wait for the spawned trainer's ``started`` event (``first_step`` with ``on_startup``, which gets
    every start-up record); :class:`ControlError` when it exits first; at ``wait_s`` it is left running."""
    deadline = time.monotonic() + wait_s
    while True:
        getter = asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait(
            [waiter, getter],
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not getter.done():
            getter.cancel()
        if getter in done:
            ev = getter.result()
            name = ev.get("name") if ev.get("kind") == "event" else ev.get("phase")
            if on_startup is not None and (ev.get("kind") == "startup" or name == "started"):
                on_startup(ev)
            if name == "started" and ev.get("pid") in (pid, None) and on_startup is None:
                return
            if name == "first_step" and ev.get("kind") == "startup" and on_startup is not None:
                return
            continue
        if waiter in done:
            await follower.drain()
            started = False
            while not events.empty():
                started |= events.get_nowait().get("name") == "started"
            rc = waiter.result().get("rc")
            tail = "\n".join(await tail_lines(helper, log, 30))
            raise ControlError(
                f"the trainer exited during start-up (exit code {rc}; "
                f"{'after' if started else 'before'} its started event). "
                f"Last lines of {log}:\n{tail}"
            )
        say(f"pid {pid} still starting after {wait_s:.0f} s; leaving it running")
        return


@dataclass(frozen=True)
class RestartPlan:
    """What a restart launches (:func:`restart_plan`): run.json's interpreter, cwd, code dir, env and
    argv with ``--resume auto``. ``code_given``: the code dir is the operator's (``--code-dir``, a deploy
    from the screen), not run.json's."""

    flags: list[str]
    python: str
    cwd: str | None
    code_dir: str | None
    env: dict[str, str]
    run_dir: str
    code_given: bool = False

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", TRAINER_MODULE, *self.flags]

    def lines(self) -> list[str]:
        """What it will run, for a prompt: interpreter, code directory, cwd, env and the command."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return [
            f"interpreter: {self.python}",
            "code directory: "
            + (
                f"{self.code_dir} ({'given' if self.code_given else 'run.json'})"
                if self.code_dir
                else "(none: the bundled trainer is deployed first)"
            ),
            f"working directory: {self.cwd or '(the home directory)'}",
            f"environment: {env or '(none)'}",
            f"command: {shlex.join(self.argv)}",
        ]


def restart_plan(
    trainer: TrainerInfo | None, run: dict | None, code_dir: str | None = None, old_folder: str | None = None
) -> RestartPlan:
    """The one planning pass of a restart, before anything is stopped: the run.json of ``trainer`` (else
    ``run``, the run dir's) made into what the relaunch starts: its interpreter, cwd, code dir (or
    ``code_dir``), env and argv + ``--resume auto``. :class:`ControlError` when there is no run.json
    (``NO_TRAINER`` without a trainer; a trainer found by its command line only cannot be restarted) or
    it cannot be launched again. ``old_folder``: run.json's ``code_dir`` as :func:`resolve_code_folder`
    found it in the container (default: :func:`code_folder` of it)."""
    run = (trainer.run if trainer and trainer.run else None) or run
    if run is None:
        if trainer is not None:
            raise ControlError(
                "restart needs the trainer's run.json (this one was found by its command "
                "line only): stop it, then launch"
            )
        raise ControlError("no trainer and no run.json to restart from", Outcome.NO_TRAINER)
    for key in ("interpreter", "argv", "output_dir"):
        if key not in run:
            raise ControlError(f"run.json has no {key!r}; cannot restart the same run")
    recorded = run.get("code_dir") if isinstance(run.get("code_dir"), str) else None
    old = old_folder or code_folder(recorded)
    new = code_folder(code_dir) or old
    env = {k: str(v) for k, v in (run.get("env") or {}).items() if v is not None}
    if new:
        env["PYTHONPATH"] = pythonpath(new, env.get("PYTHONPATH"), old, recorded)
    return RestartPlan(
        flags=set_flag(list(run["argv"]), "--resume", "auto"),
        python=run["interpreter"],
        cwd=run.get("cwd"),
        code_dir=new,
        env=env,
        run_dir=run["output_dir"],
        code_given=bool(code_dir),
    )


async def relaunch(
    helper: Helper,
    plan: RestartPlan,
    *,
    wait_s: float = 300.0,
    on_status: Callable[[str], None] | None = None,
    on_startup: Callable[[dict], None] | None = None,
    check: bool = True,
) -> ActionResult:
    """Launch ``plan`` (the second half of a restart, once the old trainer stopped)."""
    res = await launch(
        helper,
        plan.flags,
        run_dir=plan.run_dir,
        python=plan.python,
        code_dir=plan.code_dir,
        env=plan.env,
        cwd=plan.cwd,
        wait_s=wait_s,
        on_status=on_status,
        on_startup=on_startup,
        check=check,
    )
    return ActionResult(res.code, "restarted: " + res.message, res.trainer)
