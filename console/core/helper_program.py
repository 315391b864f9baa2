"""The remote helper: a stdlib-only program the console starts once per connection.

It is sent as the program text of ``python3 -c`` (inside the container through ``pct exec N --``),
so nothing is installed remotely. It speaks one JSON object per line over stdin/stdout: first it
prints a hello, then it answers requests ``{"id": n, "op": ..., ...}`` with
``{"id": n, "ok": true, "result": ...}`` or ``{"id": n, "ok": false, "error": ..., "kind": ...}``.
Streaming requests (``follow``) also send ``{"id": n, "push": {...}}`` until cancelled. Requests
run concurrently: every one that touches a file or /proc runs on its own thread, so the request loop
never blocks (a stalled mount holds one thread, not the helper); it reads and writes only regular files
and never follows a symlink in a path's last part (``_open_file``: a FIFO, a device or a link is refused
at once). Bytes travel base64-encoded. It opens no port and exits when its stdin closes (its channel is
gone), even while a request is stuck; processes it spawned run on in their own session.

This file must stay runnable by any python3 >= 3.8 with the standard library alone: it must not
import anything from the console. ``program_text()`` is what the client sends.
"""

import base64
import errno
import fcntl
import json
import os
import posixpath
import pwd
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

VERSION = 1
MAX_READ = 1 << 20

_out_lock = threading.Lock()
_cancels = {}  # request id -> threading.Event
_cancels_lock = threading.Lock()
_exit_codes = {}  # pid -> returncode, for processes this helper spawned and reaped
_spawned = {}  # pid -> Popen


def _send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("ascii")
    try:
        with _out_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except (BrokenPipeError, OSError, ValueError):
        os._exit(0)


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text.encode("ascii"))


# --- files: regular files only, links never followed ---------------------------------------------------


class NotRegularFile(OSError):
    """A path names a FIFO, a device, a socket or a directory where a regular file is needed."""


class SymlinkRefused(OSError):
    """A path (or an entry of a copied tree) is a symbolic link: it is never followed."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _kind(mode):
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _link_refusal(path):
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return SymlinkRefused(f"{path} is a symbolic link (to {target}): refused, links are never followed")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _dir_fd(root, parts):
    """An fd of the directory ``root``/``parts``, each part opened without following a link."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_refusal(root) from None
        raise
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", ".."):
                raise ValueError(f"refusing the path {'/'.join(parts)!r} under {root}")
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = os.path.join(root, *parts[: i + 1])
                    raise (_link_refusal(where) if os.path.islink(where) else e) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(path, flags=os.O_RDONLY, mode=0o600, root=None):
    """An fd of the regular file ``path`` (relative to the directory ``root`` when given: then no part
    of it may be a link, nor ``root`` itself), opened without blocking (a FIFO's open would wait for a
    writer) and without following a symlink in its last part; anything else is refused at once."""
    dfd = None
    if root is not None:
        parts = path.split("/")
        dfd = _dir_fd(root, parts[:-1])
        path, name = os.path.join(root, path), parts[-1]
    try:
        fd = os.open(
            name if dfd is not None else path,
            flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dfd,
        )
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_refusal(path) from None
        if e.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise NotRegularFile(f"{path} is a FIFO, not a regular file: refused") from None
        raise
    finally:
        if dfd is not None:
            os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is {_kind(st.st_mode)}, not a regular file: refused")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open(path, how="rb", root=None):
    """A file object over :func:`_open_file`: ``rb`` read, ``ab`` append, ``wb`` create or truncate,
    ``xb`` create a new file."""
    flags = {
        "rb": os.O_RDONLY,
        "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    }[how]
    return os.fdopen(_open_file(path, flags, 0o644, root), how.replace("x", "w"))


# --- /proc ------------------------------------------------------------------------------------------


def _read_stat(pid):
    """(state, ppid, start_time) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    return rest[0], int(rest[1]), int(rest[19])


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
# cleaner, kept equal to it by tests/console/core/test_sanitize.py (this file imports nothing).
_SGR = re.compile(r"(?:\x1b\[|\x9b)[0-9;:]*m")
_UNSAFE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x80-\x9f]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
    "|[\ud800-\udfff]"
)


def shown(text):
    """``text`` as the console shows it (console/core/sanitize.py's clean_text)."""
    if "\x1b" in text or "\x9b" in text:
        text = _SGR.sub("", text)
    return _UNSAFE.sub("\ufffd", text)


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


def _sig(value):
    if isinstance(value, int):
        return value
    return int(getattr(signal, value))


# --- ops ---------------------------------------------------------------------------------------------


def op_ping(req):
    return {"t": time.time()}


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


def op_kill(req):
    """Signal a process after checking it still is the one expected (pidfd: no PID-reuse race). Only
    ever a trainer: whatever ``expect`` says, the trainer rule and the owner rule of :func:`identity`
    are checked (never PID 1, this helper or its parents, another program, another user's process)."""
    pid = int(req["pid"])
    sig = _sig(req.get("sig", "SIGINT"))
    expect = dict(req.get("expect") or {}, trainer=True)
    expect["owner"] = expect.get("owner") or {"run_json": None}
    if pid <= 1:
        return {"sent": False, "reason": "mismatch", "why": f"pid {pid} is never signalled", "proc": None}
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return {"sent": False, "reason": "gone", "proc": None}
        except OSError:
            fd = None
    try:
        info = proc_info(pid)
        verdict, why = identity(info, expect)
        if verdict == "gone":
            return {"sent": False, "reason": "gone", "proc": info}
        if verdict != "same":
            return {"sent": False, "reason": "mismatch", "why": why, "proc": info}
        if fd is not None and hasattr(signal, "pidfd_send_signal"):
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return {"sent": True, "t": time.time(), "proc": info}
    finally:
        if fd is not None:
            os.close(fd)


def op_wait_exit(req, cancel):
    """Return when PID exits (pidfd + poll where the kernel has it, else a fast /proc poll)."""
    pid = int(req["pid"])
    timeout = req.get("timeout")
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    start_time = req.get("start_time")
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return _exited(pid, "gone")
        except OSError:
            fd = None
    try:
        info = proc_info(pid)
        verdict, _ = identity(info, {"start_time": start_time})
        if verdict != "same":
            return _exited(pid, "gone" if verdict == "gone" else "reused")
        pinned = {"start_time": info["start_time"]}  # this process, as its pidfd pins it
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
        while True:
            if cancel.is_set():
                return {"exited": False, "cancelled": True}
            wait = 0.25
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"exited": False, "timeout": True}
                wait = min(wait, left)
            if fd is not None:
                if poller.poll(wait * 1000):
                    return _exited(pid, "exit")
            else:
                end = time.monotonic() + wait
                while time.monotonic() < end:
                    if identity(proc_info(pid), pinned)[0] != "same":  # as a pidfd: this process ended
                        return _exited(pid, "exit")
                    time.sleep(0.01)
    finally:
        if fd is not None:
            os.close(fd)


def _zombie_rc(pid):
    """The exit code of a zombie not yet reaped by its parent (/proc/PID/stat field 52), else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = rest[rest.rfind(")") + 2 :].split()
    if not rest or rest[0] != "Z" or len(rest) < 50:
        return None
    status = int(rest[49])
    return status >> 8 if status & 0x7F == 0 else -(status & 0x7F)


def _exited(pid, how):
    t = time.time()
    rc = _zombie_rc(pid) if how != "reused" else None  # at once: its parent may reap it any moment
    p = _spawned.get(pid)
    if p is not None:
        try:
            rc = p.wait(0.5)
        except subprocess.TimeoutExpired:
            pass
    return {"exited": True, "how": how, "t": t, "rc": rc}


def _env(overrides):
    env = dict(os.environ)
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def op_run(req):
    argv = [str(a) for a in req["argv"]]
    limit = int(req.get("max_output", MAX_READ))
    data = req.get("input")
    try:
        p = subprocess.run(
            argv,
            cwd=req.get("cwd"),
            env=_env(req.get("env")),
            input=data.encode("utf-8") if isinstance(data, str) else None,
            stdin=None if isinstance(data, str) else subprocess.DEVNULL,
            capture_output=True,
            timeout=req.get("timeout"),
        )
    except subprocess.TimeoutExpired as e:
        return {
            "rc": None,
            "timed_out": True,
            "stdout": (e.stdout or b"")[-limit:].decode("utf-8", "replace"),
            "stderr": (e.stderr or b"")[-limit:].decode("utf-8", "replace"),
        }
    return {
        "rc": p.returncode,
        "timed_out": False,
        "stdout": p.stdout[-limit:].decode("utf-8", "replace"),
        "stderr": p.stderr[-limit:].decode("utf-8", "replace"),
    }


def op_spawn(req):
    """Start a detached process: own session, stdin from /dev/null, stdout+stderr appended to a log."""
    argv = [str(a) for a in req["argv"]]
    log = req["log"]
    d = os.path.dirname(log)
    if d:
        os.makedirs(d, exist_ok=True)
    logf = _open(log, "ab")  # closed below, once the child holds it
    try:
        p = subprocess.Popen(
            argv,
            cwd=req.get("cwd"),
            env=_env(req.get("env")),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        logf.close()
    _spawned[p.pid] = p
    threading.Thread(target=_reap, args=(p,), daemon=True).start()
    st = _read_stat(p.pid)
    return {"pid": p.pid, "start_time": st[2] if st else None}


def _reap(p):
    _exit_codes[p.pid] = p.wait()


def op_find(req):
    """Processes whose command line has an argument containing one of ``patterns``."""
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
            out.append(info)
    return out


def op_stat(req):
    try:
        st = os.stat(req["path"])
    except FileNotFoundError:
        return {"exists": False}
    return {
        "exists": True,
        "size": st.st_size,
        "mtime": st.st_mtime,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "is_file": stat.S_ISREG(st.st_mode),
        "ino": st.st_ino,
    }


def op_read(req):
    """Bytes of a regular file from ``offset`` (negative: from the end), at most ``length``. With ``root``,
    ``path`` is relative to that directory and no part of it may be a link (what the copy reads)."""
    length = min(int(req.get("length", MAX_READ)), MAX_READ)
    with _open(req["path"], root=req.get("root")) as f:
        size = os.fstat(f.fileno()).st_size
        offset = int(req.get("offset", 0))
        if offset < 0:
            offset = max(0, size + offset)
        f.seek(offset)
        data = f.read(length)
    return {"data": _b64(data), "offset": offset, "end": offset + len(data), "size": size}


def op_follow(req, cancel):
    """Push new bytes of a file from ``offset`` as they appear, until cancelled."""
    path = req["path"]
    offset = int(req.get("offset", 0))
    interval = float(req.get("interval", 0.1))
    rid = req["id"]
    f = None
    ino = None
    said_missing = False
    try:
        while not cancel.is_set():
            if f is None:
                try:
                    f = _open(path)  # kept open across polls; a FIFO or a link ends the follow
                    ino = os.fstat(f.fileno()).st_ino
                    said_missing = False
                except FileNotFoundError:
                    if not said_missing:
                        _send({"id": rid, "push": {"missing": True}})
                        said_missing = True
                    cancel.wait(interval)
                    continue
            size = os.fstat(f.fileno()).st_size
            if size < offset:
                _send({"id": rid, "push": {"truncated": True, "size": size}})
                offset = 0
            if size > offset:
                f.seek(offset)
                data = f.read(min(size - offset, MAX_READ))
                offset += len(data)
                _send({"id": rid, "push": {"data": _b64(data), "offset": offset}})
                continue
            try:
                if os.lstat(path).st_ino != ino:  # replaced: the rest of the old one is read, then the new
                    f.close()  # file from its start
                    f = None
                    offset = 0
                    _send({"id": rid, "push": {"replaced": True}})
                    continue
            except FileNotFoundError:
                pass
            cancel.wait(interval)
    finally:
        if f is not None:
            f.close()
    return {"offset": offset, "cancelled": True}


def op_write(req):
    path = req["path"]
    data = _unb64(req.get("data", ""))
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    if req.get("append"):
        with _open(path, "ab") as f:
            f.write(data)
        return {"bytes": len(data)}
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        os.unlink(tmp)  # a leftover of a crashed write (a planted link goes, its target is untouched)
    except FileNotFoundError:
        pass
    with _open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"bytes": len(data)}


def op_write_files(req):
    """Write many files under ``root`` (relative paths only)."""
    root = req["root"]
    total = 0
    for item in req["files"]:
        rel = item["path"]
        if rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"refusing path {rel!r}")
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = _unb64(item["data"])
        with _open(path, "wb") as f:
            f.write(data)
        if item.get("mode") is not None:
            os.chmod(path, int(item["mode"]))
        total += len(data)
    return {"files": len(req["files"]), "bytes": total}


def op_mkdir(req):
    os.makedirs(req["path"], exist_ok=True)
    return {}


def op_rename(req):
    os.rename(req["src"], req["dst"])
    return {}


def op_rmtree(req):
    import shutil

    shutil.rmtree(req["path"], ignore_errors=True)
    return {}


def op_scan(req):
    """Files under a folder: {relpath: [size, mtime_ns]} (at most ``limit``; symlinks not followed)."""
    root = req["path"]
    limit = int(req.get("limit", 10000))
    out = {}
    for d, _dirs, files in os.walk(root):
        for fn in files:
            p = os.path.join(d, fn)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = [st.st_size, st.st_mtime_ns]
            if len(out) >= limit:
                return {"files": out, "truncated": True}
    return {"files": out, "truncated": False}


def op_listdir(req):
    try:
        return sorted(os.listdir(req["path"]))
    except FileNotFoundError:
        return None


def _read_small(path, limit=4096):
    """The first ``limit`` bytes of a regular file as text (None when absent or refused)."""
    try:
        with _open(path) as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _is_dir(path):
    """A real directory (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _du(root):
    """(bytes, newest mtime) of the regular files under ``root``; links are not followed."""
    size, mtime = 0, 0.0
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            try:
                s = os.lstat(os.path.join(dirpath, fn))
            except OSError:
                continue
            if stat.S_ISREG(s.st_mode):
                size += s.st_size
                mtime = max(mtime, s.st_mtime)
    return size, mtime


def _export(step_dir):
    """(the serving export: ``export/``, else ``drafter/``; a link in their place, said as what it is)."""
    for name in ("export", "drafter"):
        e = os.path.join(step_dir, name)
        if os.path.islink(e):
            return None, str(_link_refusal(e))
        if _is_dir(e):
            return e, None
    return None, None


def op_checkpoints(req):
    """The run directory's filesystem (statvfs) and its checkpoints/: each step_* entry's size, mtime,
    whether it is complete (its manifest is there), what ``latest`` names, and where its drafter for
    serving is (``export/``, else ``drafter/``). Links are never followed: a linked step_* is listed with
    ``link`` (its target), a linked export with ``export_refused``."""
    run_dir = req["path"]
    out = {"free": None, "total": None, "latest": None, "entries": [], "error": None}
    try:
        st = os.statvfs(run_dir)
        out["free"] = st.f_bavail * st.f_frsize
        out["total"] = st.f_blocks * st.f_frsize
    except OSError as e:
        out["error"] = str(e)
        return out
    root = os.path.join(run_dir, "checkpoints")
    out["latest"] = (_read_small(os.path.join(root, "latest")) or "").strip() or None
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        p = os.path.join(root, name)
        if not name.startswith("step_"):
            continue
        if os.path.islink(p):
            entry = {"name": name, "path": p, "bytes": 0, "mtime": None, "complete": False, "export": None}
            out["entries"].append({**entry, "link": str(_link_refusal(p))})
            continue
        if not _is_dir(p):
            continue
        size, mtime = _du(p)
        export, refused = _export(p)
        manifest = os.path.join(p, "manifest.json")
        entry = {
            "name": name,
            "path": p,
            "bytes": size,
            "mtime": mtime or None,
            # step_N.bad: a checkpoint the trainer set aside (it did not verify), never offered as complete
            "complete": ".tmp-" not in name
            and ".bad" not in name
            and os.path.isfile(manifest)
            and not os.path.islink(manifest),
            "export": export,
        }
        out["entries"].append({**entry, "export_refused": refused} if refused else entry)
    return out


def op_tree(req):
    """Every regular file under a real directory: relative path, size, mtime, mode (sorted). A link (the
    directory itself or any entry under it), a FIFO, a device or a socket is refused, naming it."""
    root = req["path"]
    if os.path.islink(root):
        raise _link_refusal(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for fn in [*dirs, *sorted(files)]:
            p = os.path.join(dirpath, fn)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise _link_refusal(p)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{p} is {_kind(st.st_mode)}, not a regular file: refused")
            rel = os.path.relpath(p, root)
            out.append({"rel": rel, "size": st.st_size, "mtime": st.st_mtime, "mode": st.st_mode & 0o7777})
    return out


def op_sha256(req):
    import hashlib

    h = hashlib.sha256()
    with _open(req["path"], root=req.get("root")) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- threads of a run (the console's threads view) -----------------------------------------------------

MAX_PROCS = 64  # processes of one run a sample reads (the launcher first, then its descendants)
MAX_THREADS = 512  # threads of one process
MAX_SCAN = 65536  # /proc entries looked at for children
MAX_DEPTH = 4  # generations below the launcher (its workers, what they start)
PROC_READ = 4096  # bytes of one /proc file
CMDLINE_SHOWN = 240  # characters of a command line
DUMP_OUTPUT = 64 << 10  # bytes of py-spy's output
DUMP_TIMEOUT_S = 20.0


def _proc_bytes(path, limit=PROC_READ):
    """At most ``limit`` bytes of a /proc file, never through a link (None when it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_fields(raw):
    """{comm, state, ppid, ticks (utime + stime), start_time, cpu} of a /proc stat line, or None. The
    comm (field 2) may hold anything but NUL, ')' and spaces included: it is what lies between the
    first '(' and the last ')'."""
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    i, j = text.find("("), text.rfind(")")
    rest = text[j + 2 :].split()
    if i < 0 or j < i or len(rest) < 37:
        return None
    try:
        return {
            "comm": text[i + 1 : j],
            "state": rest[0],
            "ppid": int(rest[1]),
            "ticks": int(rest[11]) + int(rest[12]),
            "start_time": int(rest[19]),
            "cpu": int(rest[36]),
        }
    except ValueError:
        return None


def _children(limit=MAX_SCAN):
    """({ppid: [pid, ...]} of the live processes, whether the scan stopped at ``limit`` entries)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out, False
    capped = len(names) > limit
    for name in names[:limit]:
        if not name.isdigit():
            continue
        st = _stat_fields(_proc_bytes(f"/proc/{name}/stat"))
        if st is not None and st["state"] not in ("Z", "X"):
            out.setdefault(st["ppid"], []).append(int(name))
    return out, capped


def run_pids(root, max_procs=MAX_PROCS):
    """(the run's pids: ``root`` first, then its descendants breadth first, at most ``max_procs``;
    how many were found in all; whether the /proc scan was cut)."""
    kids, scan_capped = _children()
    out, seen, level = [root], {root}, [root]
    for _ in range(MAX_DEPTH):
        level = [c for p in level for c in sorted(kids.get(p, ())) if c not in seen]
        seen.update(level)
        out.extend(level)
    return out[:max_procs], len(out), scan_capped


def _cmdline_shown(pid):
    raw = _proc_bytes(f"/proc/{pid}/cmdline") or b""
    words = [os.fsdecode(w) for w in raw.split(b"\0") if w]
    return " ".join(words)[:CMDLINE_SHOWN]


def _threads_of(pid, max_threads):
    """([[tid, comm, state, ticks, cpu, start_time], ...] of at most ``max_threads`` threads, how many
    the process has)."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return [], 0
    out = []
    for tid in tids[:max_threads]:
        st = _stat_fields(_proc_bytes(f"/proc/{pid}/task/{tid}/stat"))
        if st is not None:
            out.append([tid, st["comm"], st["state"], st["ticks"], st["cpu"], st["start_time"]])
    return out, len(tids)


def _process(pid, max_threads):
    """One process of the run as a sample gives it, or None when it is gone. Its own stat is read after
    its threads': its ticks (those of every thread it had) are then at least theirs."""
    threads, total = _threads_of(pid, max_threads)
    st = _stat_fields(_proc_bytes(f"/proc/{pid}/stat"))
    if st is None or st["state"] in ("Z", "X"):
        return None
    return {
        "pid": pid,
        "ppid": st["ppid"],
        "comm": st["comm"],
        "state": st["state"],
        "ticks": st["ticks"],
        "start_time": st["start_time"],
        "cmdline": _cmdline_shown(pid),
        "threads": threads,
        "threads_total": total,
    }


def _run_root(req):
    """(the run's launcher pid, None) when ``pid`` still is the trainer ``start_time`` names, else
    (None, why)."""
    pid = int(req["pid"])
    expect = {"start_time": req.get("start_time"), "trainer": True, "run_dir": req.get("run_dir")}
    verdict, why = identity(proc_info(pid), expect)
    if verdict != "same":
        return None, f"pid {pid} is not the trainer: {why}"
    return pid, None


def op_threads(req):
    """Every process of a run (the trainer ``pid`` with ``start_time``, then its descendants through
    /proc/*/stat ppid) and its threads (/proc/PID/task/*/stat): tid, comm, state, utime + stime in
    clock ticks, last CPU. ``t`` is this helper's monotonic clock at the sample: CPU% is ticks over
    time between two samples, ``clk_tck`` ticks a second. Bounded: ``max_procs``, ``max_threads`` a
    process (``threads_total`` says how many there are), ``procs_total`` how many processes were found."""
    root, why = _run_root(req)
    if root is None:
        return {"gone": True, "why": why}
    max_procs = max(1, min(int(req.get("max_procs", MAX_PROCS)), MAX_PROCS))
    max_threads = max(1, min(int(req.get("max_threads", MAX_THREADS)), MAX_THREADS))
    pids, total, scan_capped = run_pids(root, max_procs)
    t = time.monotonic()
    procs = [p for p in (_process(pid, max_threads) for pid in pids) if p is not None]
    return {
        "gone": False,
        "t": t,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        "ncpu": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "root": root,
        "procs": procs,
        "procs_total": total,
        "scan_capped": scan_capped,
        "max_threads": max_threads,
    }


def _executable(path):
    """Why ``path`` cannot be run as py-spy, or None: it must be a regular executable file, not a link."""
    try:
        st = os.lstat(path)
    except OSError:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return str(_link_refusal(path))
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    return None


def find_pyspy(interpreters=()):
    """(py-spy's path or None, what was looked at): on this helper's PATH, then beside the run's
    interpreters (a virtualenv's bin/)."""
    places = [os.path.join(d, "py-spy") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for exe in interpreters:
        if exe and os.path.isabs(exe):
            places.append(os.path.join(os.path.dirname(exe), "py-spy"))
    looked = []
    for p in dict.fromkeys(places):
        why = _executable(p)
        if why is None:
            return p, looked
        looked.append(p if why == "absent" else why)
    return None, looked


def op_pyspy(req):
    """``py-spy dump --pid PID`` of one process of the run (the trainer ``root`` with ``start_time``,
    or one of its descendants; ``pid_start_time`` pins that process), with a timeout; the output bounded.
    Read-only: py-spy reads the process's memory. ``found`` false says where py-spy was looked for."""
    root, why = _run_root(dict(req, pid=req["root"]))
    if root is None:
        return {"ran": False, "why": why}
    pid = int(req["pid"])
    pids, _total, _capped = run_pids(root)
    st = _stat_fields(_proc_bytes(f"/proc/{pid}/stat"))
    pinned = req.get("pid_start_time")
    if pid not in pids or st is None or (pinned is not None and st["start_time"] != pinned):
        return {"ran": False, "why": f"pid {pid} is not a process of this run (now)"}
    argv0 = (_proc_bytes(f"/proc/{pid}/cmdline") or b"").split(b"\0")[0]
    path, looked = find_pyspy([req.get("interpreter"), os.fsdecode(argv0)])
    if path is None:
        return {"ran": False, "found": False, "looked": looked}
    timeout = min(float(req.get("timeout", DUMP_TIMEOUT_S)), 120.0)
    argv = [path, "dump", "--pid", str(pid)]
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        rc, out, err, timed_out = p.returncode, p.stdout, p.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, out, err, timed_out = None, e.stdout or b"", e.stderr or b"", True
    return {
        "ran": True,
        "found": True,
        "path": path,
        "argv": argv,
        "rc": rc,
        "timed_out": timed_out,
        "stdout": out[:DUMP_OUTPUT].decode("utf-8", "replace"),
        "stderr": err[:DUMP_OUTPUT].decode("utf-8", "replace"),
        "cut": len(out) > DUMP_OUTPUT or len(err) > DUMP_OUTPUT,
    }


def op_cancel(req):
    with _cancels_lock:
        ev = _cancels.get(int(req["target"]))
    if ev is not None:
        ev.set()
    return {"found": ev is not None}


# Answered on the request loop itself: nothing that touches a file or /proc (a stalled mount, a FIFO,
# a process stuck in the kernel) may hold the loop that reads the next request and sees stdin close.
QUICK = {"ping": op_ping, "cancel": op_cancel}
SLOW = {
    "proc": op_proc,
    "identify": op_identify,
    "kill": op_kill,
    "stat": op_stat,
    "read": op_read,
    "mkdir": op_mkdir,
    "rename": op_rename,
    "listdir": op_listdir,
    "write": op_write,
    "checkpoints": op_checkpoints,
    "tree": op_tree,
    "sha256": op_sha256,
    "run": op_run,
    "spawn": op_spawn,
    "find": op_find,
    "write_files": op_write_files,
    "rmtree": op_rmtree,
    "scan": op_scan,
    "threads": op_threads,
    "pyspy": op_pyspy,
}
CANCELLABLE = {"wait_exit": op_wait_exit, "follow": op_follow}


def _reply(rid, fn, req, *extra):
    try:
        result = fn(req, *extra)
        _send({"id": rid, "ok": True, "result": result})
    except Exception as e:  # every failure goes back to the caller, the helper stays up
        _send({"id": rid, "ok": False, "error": str(e) or type(e).__name__, "kind": type(e).__name__})
    finally:
        if extra:
            with _cancels_lock:
                _cancels.pop(rid, None)


def _handle(req):
    rid = req.get("id")
    op = req.get("op")
    if op in QUICK:
        _reply(rid, QUICK[op], req)
    elif op in SLOW:
        threading.Thread(target=_reply, args=(rid, SLOW[op], req), daemon=True).start()
    elif op in CANCELLABLE:
        ev = threading.Event()
        with _cancels_lock:
            _cancels[rid] = ev
        threading.Thread(target=_reply, args=(rid, CANCELLABLE[op], req, ev), daemon=True).start()
    else:
        _send({"id": rid, "ok": False, "error": f"unknown op {op!r}", "kind": "ValueError"})


def main():
    _send(
        {
            "hello": "dflash-console-helper",
            "version": VERSION,
            "pid": os.getpid(),
            "python": sys.executable,
            "python_version": list(sys.version_info[:3]),
            "pidfd": hasattr(os, "pidfd_open"),
            "home": os.path.expanduser("~"),
            "cwd": os.getcwd(),
            "hostname": socket.gethostname(),
            "uid": os.getuid(),
        }
    )
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            os._exit(0)  # channel gone: leave at once; spawned processes live on in their sessions
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line.decode("utf-8"))
        except ValueError:
            _send({"id": None, "ok": False, "error": "bad request line", "kind": "ValueError"})
            continue
        _handle(req)


if __name__ == "__main__":
    main()


def program_text():
    """The source sent as ``python3 -c``: this file, which only uses the standard library."""
    with open(__file__, encoding="utf-8") as f:
        return f.read()
