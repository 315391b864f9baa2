"""Processes: run a command, spawn the trainer detached, signal it (pidfd, after the identity check) and
wait for its exit."""

import os
import select
import signal
import subprocess
import threading
import time

from .files import _open
from .framing import MAX_READ
from .identity import _read_stat, _stat_rest, identity, proc_info

_exit_codes = {}  # pid -> returncode, for processes this helper spawned and reaped
_spawned = {}  # pid -> Popen


def _sig(value):
    if isinstance(value, int):
        return value
    return int(getattr(signal, value))


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
    rest = _stat_rest(pid)
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
    """Run a command to its end (``timeout``: then its whole process group is killed, children too, and
    ``timed_out`` says so); its output's last ``max_output`` bytes."""
    argv = [str(a) for a in req["argv"]]
    limit = int(req.get("max_output", MAX_READ))
    data = req.get("input")
    p = subprocess.Popen(
        argv,
        cwd=req.get("cwd"),
        env=_env(req.get("env")),
        stdin=subprocess.PIPE if isinstance(data, str) else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: a timeout kills what it started too
    )
    timed_out = False
    try:
        out, err = p.communicate(data.encode("utf-8") if isinstance(data, str) else None, req.get("timeout"))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(p.pid)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in the kernel: what it wrote so far is given up
            out, err = b"", b""
    return {
        "rc": None if timed_out else p.returncode,
        "timed_out": timed_out,
        "stdout": (out or b"")[-limit:].decode("utf-8", "replace"),
        "stderr": (err or b"")[-limit:].decode("utf-8", "replace"),
    }


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
