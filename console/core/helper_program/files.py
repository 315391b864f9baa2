"""Files: regular files only, links never followed (``_open_file``: a FIFO, a device, a socket or a link is
refused at once), and the ops that read, follow and write them."""

import errno
import fcntl
import os
import stat
import threading

from .framing import MAX_READ, _b64, _send, _unb64


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


def op_clean_temp(req):
    """Remove the deploy's temporary folders that a dropped link left in ``base``: only entries whose
    name is a whole match of the ``pattern`` the console makes them with, that are real folders (never
    a link: lstat; rmtree does not follow links inside), belong to this helper's user, and were last
    changed more than ``older_s`` ago by this machine's clock (a deploy under way is left alone).
    Returns the names removed."""
    import re
    import shutil
    import time

    base, pattern = req["path"], re.compile(req["pattern"])
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    removed, now = [], time.time()
    for name in names[:10000]:
        if not pattern.fullmatch(name):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < req["older_s"]:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(name)
    return removed


def op_listdir(req):
    try:
        return sorted(os.listdir(req["path"]))
    except FileNotFoundError:
        return None


def op_sha256(req):
    import hashlib

    h = hashlib.sha256()
    with _open(req["path"], root=req.get("root")) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
