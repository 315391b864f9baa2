"""The request loop, the last piece: the op tables, a request answered on the loop (``ping``, ``cancel``)
or on a thread of its own, and ``main`` (the hello, then one request a line until stdin closes)."""

import json
import os
import signal
import socket
import sys
import threading
import time

from .files import (
    op_clean_temp,
    op_follow,
    op_listdir,
    op_mkdir,
    op_read,
    op_rename,
    op_rmtree,
    op_sha256,
    op_stat,
    op_write,
    op_write_files,
)
from .framing import VERSION, _send
from .identity import op_find, op_identify, op_proc
from .loopback_http import op_http_get
from .run_threads import op_pyspy, op_threads
from .spawning import op_kill, op_run, op_spawn, op_wait_exit
from .trees import op_checkpoints, op_scan, op_tree

_cancels = {}  # request id -> threading.Event
_cancels_lock = threading.Lock()


def op_ping(req):
    return {"t": time.time()}


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
    "clean_temp": op_clean_temp,
    "scan": op_scan,
    "threads": op_threads,
    "pyspy": op_pyspy,
    "http_get": op_http_get,
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


TERM_GRACE_S = 1.0


def _on_term(signum, frame):
    """A scheduler ending the job this helper runs in (a Slurm job whose batch script was the trainer)
    sends SIGTERM as the trainer exits: leave a moment later, so that the answer that saw the exit (its
    code, at once) goes out first."""
    threading.Timer(TERM_GRACE_S, os._exit, (0,)).start()


def _name_process(name=b"dflash-console-helper"):
    """Its comm (what ``ps -o comm``, ``top`` and ``pgrep NAME`` show; the kernel keeps 15 bytes)."""
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(name[:15])
    except OSError:
        pass


def main():
    signal.signal(signal.SIGTERM, _on_term)
    _name_process()
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
            "slurm_job": os.environ.get("SLURM_JOB_ID"),  # inside a job's step: it ends with the job
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
