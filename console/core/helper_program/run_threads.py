"""Threads of a run (the console's threads view): every process of the run and its threads from /proc,
and ``py-spy dump`` of one of them."""

import os
import stat
import subprocess
import time

from .files import _link_refusal
from .identity import identity, proc_info

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


def _trusted_owner(st):
    """The file or folder belongs to root or to this helper's user."""
    return st.st_uid in (0, os.geteuid())


def _untrusted_folder(path, st):
    """Why a folder on the way to py-spy lets someone else swap it, or None: each folder up to / must
    belong to root or the helper's user and be writable by no one else (a sticky one, like /tmp, may be
    when what lies in it is root's or the helper user's)."""
    child, folder = st, os.path.dirname(path)
    while True:
        try:
            st = os.stat(folder)
        except OSError as e:
            return f"{folder}: {e.strerror or e}"
        if not _trusted_owner(st):
            return f"{folder} belongs to uid {st.st_uid}, not to root or the helper's user"
        if st.st_mode & 0o022 and not (
            st.st_mode & stat.S_ISVTX and child is not None and _trusted_owner(child)
        ):
            return f"{folder} is writable by group or others ({stat.filemode(st.st_mode)})"
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        child, folder = st, parent


def _executable(path):
    """Why ``path`` cannot be run as py-spy, or None: it must be a regular executable file, not a link,
    belong to root or the helper's user, and be writable by no one else, nor its folders (those it
    really lies in: a folder on the way that is a link is followed to where it points, and that path is
    the one run)."""
    try:
        st = os.lstat(path)
    except OSError:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return str(_link_refusal(path))
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    if not _trusted_owner(st):
        return f"{path} belongs to uid {st.st_uid}, not to root or the helper's user"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others ({stat.filemode(st.st_mode)})"
    why = _untrusted_folder(os.path.realpath(path), st)
    return None if why is None else f"{path}: {why}"


def find_pyspy(configured=None):
    """(py-spy's path or None, what was looked at and why each was not taken). Only the operator's own
    choice (``configured``: the config file's or the command line's) or this helper's PATH: never a
    folder the run names (its interpreter, a process's argv[0]), which its writer could fill."""
    if configured:
        places = [configured] if os.path.isabs(configured) else []
        if not places:
            return None, [f"{configured} is not an absolute path"]
    else:
        dirs = os.environ.get("PATH", "").split(os.pathsep)
        places = [os.path.join(d, "py-spy") for d in dirs if os.path.isabs(d)]  # never "." or ""
    looked = []
    for p in dict.fromkeys(places):
        why = _executable(p)
        if why is None:
            return os.path.realpath(p), looked
        looked.append(p if why == "absent" else why)
    return None, looked


def op_pyspy(req):
    """``py-spy dump --pid PID`` of one process of the run (the trainer ``root`` with ``start_time``,
    or one of its descendants; ``pid_start_time`` pins that process), with a timeout; the output bounded.
    Read-only: py-spy reads the process's memory. py-spy is ``pyspy`` (the operator's) or on this helper's
    PATH (:func:`find_pyspy`); ``found`` false says where it was looked for and why none was taken."""
    root, why = _run_root(dict(req, pid=req["root"]))
    if root is None:
        return {"ran": False, "why": why}
    pid = int(req["pid"])
    pids, _total, _capped = run_pids(root)
    st = _stat_fields(_proc_bytes(f"/proc/{pid}/stat"))
    pinned = req.get("pid_start_time")
    if pid not in pids or st is None or (pinned is not None and st["start_time"] != pinned):
        return {"ran": False, "why": f"pid {pid} is not a process of this run (now)"}
    path, looked = find_pyspy(req.get("pyspy"))
    if path is None:
        return {"ran": False, "found": False, "looked": looked, "configured": bool(req.get("pyspy"))}
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
