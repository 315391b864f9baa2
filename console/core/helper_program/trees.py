"""Walks of a directory: the files under a run's output dir (``scan``), its checkpoints with the
filesystem's free space (``checkpoints``), every regular file of a directory to copy (``tree``)."""

import os
import stat

from .files import NotRegularFile, _kind, _link_refusal, _open


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
