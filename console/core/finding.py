"""Finding the trainer through the helper: run.json first, else the command lines /proc shows; and
``identify``, the one question (is this PID still that trainer?) every find, stop, resume and restart asks.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from console.core.events import TrainerInfo
from console.core.helper import Helper
from console.core.trainer_argv import TRAINER_MODULE, USER_SCRIPT, flag_value, is_trainer_cmdline, resolve


async def read_run_json(helper: Helper, run_dir: str) -> dict | None:
    run = await helper.read_json(posixpath.join(run_dir, "run.json"))
    return run if isinstance(run, dict) else None


@dataclass
class Verdict:
    """The helper's answer to "is this PID still that trainer?" (``helper_program.identity.identity``)."""

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
    """What the trainer is known by, for the helper to check a PID against (``helper_program.identity.identity``):
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
    one rule lives in the helper (``helper_program.identity.identity``), where /proc is read. An answer that is
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
