"""/proc and identity: a process as /proc shows it (``proc_info``), the trainer's command line, and
``identity``, the one rule of "is this PID still that process?"; the ops that ask it."""

import os
import posixpath
import pwd
import re
import signal


def _stat_rest(pid):
    """/proc/PID/stat's fields from 3 (state) on, or None when the process is gone: field N is [N - 3]."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def _read_stat(pid):
    """(state, ppid, start_time) from /proc/PID/stat, or None when the process is gone."""
    rest = _stat_rest(pid)
    if rest is None:
        return None
    return rest[0], int(rest[1]), int(rest[19])  # fields 3, 4 and 22 (starttime)


def proc_info(pid):
    st = _read_stat(pid)
    if st is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    cmdline = [os.fsdecode(p) for p in raw.split(b"\0")[:-1]] if raw else []
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    state = st[0]
    status = _status(pid)
    return {
        "pid": pid,
        "state": state,
        "alive": state not in ("Z", "X", "x"),
        "ppid": st[1],
        "start_time": st[2],
        "cmdline": cmdline,
        "cwd": cwd,
        "uid": _uid(pid, status),
        "ignores": _ignored(status),  # of STOP_SIGNALS
    }


NOT_RUNNING = "not running"
TRAINER_MODULE = "trainer.pipeline"
USER_SCRIPT = "train_dflash_pipeline.py"
LAUNCHERS = ("python", "torchrun", "accelerate", "deepspeed")


STOP_SIGNALS = ("SIGINT", "SIGTERM")


def _status(pid):
    """The lines of /proc/PID/status a check reads ({b"Uid": [...], b"SigIgn": [...], ...}); {} if unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return {}
    out = {}
    for line in raw.split(b"\n"):
        key, _, rest = line.partition(b":")
        out[key] = rest.split()
    return out


def _uid(pid, status=None):
    """The effective uid of PID (the ``Uid:`` line of /proc/PID/status), or None."""
    parts = (status if status is not None else _status(pid)).get(b"Uid", [])
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _ignored(status):
    """Which of ``STOP_SIGNALS`` the process ignores (its ``SigIgn`` mask; signal N is bit N - 1). A Python
    program started in the background by a shell without job control (``nohup ... &`` in a script) inherits
    SIGINT ignored and keeps it so unless it installs a handler: Ctrl-C's KeyboardInterrupt never comes."""
    try:
        bits = int((status.get(b"SigIgn") or [b""])[0], 16)
    except ValueError:
        return []
    return [name for name in STOP_SIGNALS if bits >> (int(getattr(signal, name)) - 1) & 1]


def _user(uid):
    """``uid N (name)``, as a refusal says an owner."""
    if uid is None:
        return "an unknown uid"
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _owners(run_json):
    """{uid: whose} a trainer may run as: the helper's own, and the owner of its run.json (the trainer
    writes that file as itself; run.json has no uid field, so this works for every run.json)."""
    out = {os.geteuid(): "the helper's"}
    if run_json:
        try:
            out.setdefault(os.stat(run_json).st_uid, "run.json's owner")
        except OSError:
            pass
    return out


def is_trainer_cmdline(cmdline):
    """The trainer's command line: ``python ... -m trainer.pipeline ...`` or ``python ...
    train_dflash_pipeline.py ...`` (also under torchrun, accelerate, deepspeed), within its first six
    words. Its workers (``-m trainer.worker``) are not: the console signals the launcher only."""
    if not cmdline or not posixpath.basename(cmdline[0]).startswith(LAUNCHERS):
        return False
    for i, arg in enumerate(cmdline[:6]):
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] == TRAINER_MODULE:
            return True
        if i > 0 and posixpath.basename(arg) == USER_SCRIPT:
            return True
    return False


def _ancestors():
    """This helper's pid and those of its parents (the shell, pct, sshd ... up to init)."""
    out, pid = set(), os.getpid()
    while pid > 0 and pid not in out:
        out.add(pid)
        st = _read_stat(pid)
        pid = st[1] if st else 0
    return out


def flag_value(argv, name):
    """The value of ``--name X`` / ``--name=X`` (the last wins, as argparse does), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def _same_dir(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def _not_the_trainer(info, expect):
    """Why the live process ``info`` cannot be the trainer whatever else is known of it, or None:
    PID 1, this helper or one of its parents, a command line that is not the trainer's, another run
    directory than ``expect["run_dir"]`` (its --output-dir, against its own cwd)."""
    pid = info["pid"]
    if pid <= 1:
        return f"pid {pid} is the container's init, never the trainer"
    if pid in _ancestors():
        return f"pid {pid} is this helper or one of its parents, never the trainer"
    if not is_trainer_cmdline(info["cmdline"]):
        return (
            "its command line is not the trainer's (python -m trainer.pipeline or train_dflash_pipeline.py)"
        )
    run_dir = expect.get("run_dir")
    if run_dir:
        out = flag_value(info["cmdline"], "--output-dir")
        if out is None:
            return f"it has no --output-dir, and run.json is in {run_dir}"
        path = out if os.path.isabs(out) else os.path.join(info["cwd"] or "/", out)
        if not _same_dir(path, run_dir):
            return f"its --output-dir is {out}, not {run_dir}"
    return None


# The console cleans every string it gets from here (console/core/sanitize.py: escape sequences and
# control characters become U+FFFD), so a command line it knows may be the cleaned one. This is that
# cleaner, kept equal to it by tests/console/core/test_sanitize.py (the helper imports nothing).
_INVISIBLE_CHARS = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\u3164\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e007f"
)
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE_CHARS}]")
_SGR = re.compile(r"(?:\x1b\[|\x9b)[0-9;:]*m")
_UNSAFE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x80-\x9f]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
    "|[\ud800-\udfff]"
    f"|[{_INVISIBLE_CHARS}]"
)


def _shown_one(m):
    c = m.group()
    if not _INVISIBLE_RE.fullmatch(c):
        return "\ufffd"
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def shown(text):
    """``text`` as the console shows it (console/core/sanitize.py's clean_text)."""
    if "\x1b" in text or "\x9b" in text:
        text = _SGR.sub("", text)
    return _UNSAFE.sub(_shown_one, text)


def _same_argv(real, expected):
    """The command line is the expected one, as it is or as the console shows it (cleaned)."""
    return real == expected or [shown(a) for a in real] == expected


def identity(info, expect):
    """The one rule of "is this PID still that process?" (the trainer, for stop, restart and find).

    ``info`` is proc_info of the PID (None: there is none); ``expect`` what is known of the process,
    each part checked when present: ``start_time`` (/proc/PID/stat field 22: with the PID it names one
    process), ``trainer`` (true: it must be a trainer at all, :func:`_not_the_trainer`, checking
    ``run_dir`` too), ``argv_rest`` (its command line after argv[0], which may be spelled differently),
    ``owner`` (``{"run_json": path or None}``: its effective uid must be one of :func:`_owners`).
    Returns ``("same", None)``, ``("gone", why)`` (not running, or a zombie) or ``("other", why)``,
    where ``why`` says what was found.
    """
    if info is None or not info["alive"]:
        return "gone", NOT_RUNNING
    expect = expect or {}
    st = expect.get("start_time")
    if st is not None and info["start_time"] != st:
        return "other", f"start time {info['start_time']} vs {st}"
    if expect.get("trainer"):
        why = _not_the_trainer(info, expect)
        if why:
            return "other", why
    rest = expect.get("argv_rest")
    if rest is not None and not _same_argv(info["cmdline"][1:], list(rest)):
        return "other", "another command line"
    owner = expect.get("owner")
    if owner is not None:
        uid = info["uid"] if "uid" in info else _uid(info["pid"])
        allowed = _owners(owner.get("run_json"))
        if uid not in allowed:
            ok = " or ".join(f"{_user(u)}, {whose}" for u, whose in sorted(allowed.items()))
            return "other", f"owned by {_user(uid)}, not {ok}"
    return "same", None


def op_proc(req):
    return proc_info(int(req["pid"]))


def op_identify(req):
    """Is PID still the process ``expect`` names (:func:`identity`)? The verdict, why, and its /proc;
    ``owner`` says it when the process is taken for the trainer as its run.json's owner's, not the
    helper's user's."""
    info = proc_info(int(req["pid"]))
    verdict, why = identity(info, req.get("expect"))
    out = {"identity": verdict, "why": why, "proc": info}
    if verdict == "same" and info["uid"] != os.geteuid():
        out["owner"] = (
            f"runs as {_user(info['uid'])}, its run.json's owner, not as the helper's {_user(os.geteuid())}"
        )
    return out


CMDLINE_CAP = 16 << 10  # characters of a command line that op_find returns


def _cut_cmdline(info, cap=CMDLINE_CAP):
    """``info`` with its command line cut to ``cap`` characters (``cmdline_cut``: it was longer): the
    kernel allows megabytes, and another user's process may hold them. A cut one is never the same
    command line to :func:`identity`, so such a process is shown, never signalled."""
    out, used = [], 0
    for arg in info["cmdline"]:
        if used + len(arg) > cap:
            out.append(arg[: max(0, cap - used)] + "...")
            return dict(info, cmdline=out, cmdline_cut=True)
        out.append(arg)
        used += len(arg)
    return info


def op_find(req):
    """Processes whose command line has an argument containing one of ``patterns`` (each command line
    cut to CMDLINE_CAP characters after the match)."""
    pats = [str(p) for p in req["patterns"]]
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        info = proc_info(int(name))
        if info is None or not info["alive"]:
            continue
        if any(pat in arg for arg in info["cmdline"] for pat in pats):
            out.append(_cut_cmdline(info))
    return out
