"""``py-spy dump`` of one process of the run, through the helper (its ``pyspy`` op,
console/core/helper_program/run_threads.py): the Python stack of every thread, what ``py-spy dump --pid PID`` prints
in a second SSH session today.

py-spy must be in the container: where the operator says (``pyspy`` of the target in the config file,
``threads --pyspy PATH``) or else on the helper's own PATH; never beside the run's interpreter or a
process's argv[0], which whoever writes run.json or owns the trainer could fill (the helper runs as
root). The helper takes it only when it and every folder above it belong to root or the helper's user
and nobody else can write them; when none is taken, :class:`Dump` says where it looked and why. The
helper runs it as an argument list with a timeout, only for the trainer or one of its descendants, and
bounds its output; the text is
cleaned by the helper client and cut here to :data:`MAX_LINES` lines. It reads the process's memory and
changes nothing, so a read-only session may ask for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from console.core.events import TrainerInfo

MAX_LINES = 2000
MAX_LINE = 400
TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Dump:
    pid: int
    ok: bool  # py-spy ran and exited 0
    text: str  # its output, or why there is none
    found: bool = True  # py-spy is in the container
    path: str | None = None


def _bounded(text: str) -> str:
    lines = text.splitlines()
    cut = [ln if len(ln) <= MAX_LINE else ln[:MAX_LINE] + "…" for ln in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        cut.append(f"… {len(lines) - MAX_LINES} more lines not shown")
    return "\n".join(cut).replace("\r", "")


def _not_found(pid: int, looked: object, configured: bool = False) -> Dump:
    places = [str(p) for p in looked] if isinstance(looked, list) else []
    where = "; ".join(places[:12]) or "nothing to look at"
    said = "the py-spy configured for this target" if configured else "the helper's PATH"
    return Dump(
        pid,
        False,
        f"py-spy is not in the container: looked at {said} ({where}). Install it where only root can "
        "write it (pip install py-spy) and name it (pyspy = PATH in the target's config entry, or "
        "threads --pyspy PATH) to see the Python stacks.",
        found=False,
    )


def result(pid: int, reply: object) -> Dump:
    """The :class:`Dump` of one ``pyspy`` reply (a reply that is not one is said as such)."""
    if not isinstance(reply, dict):
        return Dump(pid, False, "the helper's py-spy reply is not one")
    if not reply.get("ran"):
        if reply.get("found") is False:
            return _not_found(pid, reply.get("looked"), bool(reply.get("configured")))
        return Dump(pid, False, f"not run: {str(reply.get('why') or '?')[:300]}")
    path = str(reply.get("path") or "py-spy")
    out, err = str(reply.get("stdout") or ""), str(reply.get("stderr") or "")
    cut = "\n(output cut: too long)" if reply.get("cut") else ""
    if reply.get("timed_out"):
        return Dump(pid, False, _bounded(f"{path} dump --pid {pid} did not finish in time\n{err}"), path=path)
    rc = reply.get("rc")
    if rc != 0:
        why = err.strip() or out.strip() or "no output"
        return Dump(pid, False, _bounded(f"{path} dump --pid {pid} failed (exit {rc}): {why}"), path=path)
    return Dump(pid, True, _bounded(out + cut), path=path)


async def dump(
    helper,
    trainer: TrainerInfo,
    pid: int,
    pid_start_time: int | None = None,
    run_dir: str | None = None,
    timeout: float = TIMEOUT_S,
    configured: str | None = None,
) -> Dump:
    """``py-spy dump --pid PID`` of ``pid`` (the trainer or one of its descendants; ``pid_start_time``
    pins the process a sample showed), with the operator's ``configured`` py-spy or the helper's PATH's."""
    args: dict = {"root": trainer.pid, "start_time": trainer.start_time, "pid": int(pid), "timeout": timeout}
    if pid_start_time is not None:
        args["pid_start_time"] = pid_start_time
    if run_dir:
        args["run_dir"] = run_dir
    if configured:
        args["pyspy"] = configured
    return result(int(pid), await helper.call("pyspy", wait_s=timeout + 30.0, **args))
