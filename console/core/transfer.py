"""Copy a remote directory (an exported drafter) to this machine over the session's one SSH
connection, through the helper (``tree``, ``read``, ``sha256``), with progress; a dropped link is
waited out (the session reconnects by itself) and the copy resumes where it stopped.

Each file is written to ``NAME.part`` beside its final name and renamed only when its size and
SHA-256 match the remote file's, so the destination never holds a torn file under its real name, and a
copy started again later (even by another console) skips what is complete and resumes each ``.part``
from its size. A ``.part`` longer than the remote file, or a file whose hash does not match, starts
over once; a second mismatch is an error (the remote file is changing).

No link is ever followed. Remotely the helper lists only regular files under a real directory and refuses
a link anywhere in the tree, naming its target (``tree``), and reads each file relative to that directory
with no link in its path (``read``/``sha256`` with ``root``). Locally a ``.part`` is a regular file this
copy made itself (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600; anything else in its place, a planted link
above all, is removed, never opened), a folder on the way that is a link is refused, and a finished file
gets the remote file's mode without group or other write or execute (a 0600 key stays 0600).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from console.core.helper import Helper, HelperError, HelperGone

PART = ".part"


class CopyError(RuntimeError):
    """The copy cannot finish (the remote is gone or changing, the link stayed down, a local error)."""


@dataclass
class CopyProgress:
    done_bytes: int
    total_bytes: int
    file: str  # relative path of the file being copied
    files_done: int
    files_total: int
    reconnects: int  # link drops waited out so far


@dataclass
class CopyResult:
    local: Path
    files: int
    bytes: int
    copied_bytes: int  # moved over the link this time (less than ``bytes`` when resumed)
    reconnects: int
    seconds: float


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _complete(final: Path, size: int, remote_hash: str) -> bool:
    """``final`` is already the remote file: a regular file (not a link) of its size and hash."""
    try:
        fd = os.open(final, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size == size and _sha256_fd(fd) == remote_hash
    finally:
        os.close(fd)


def _folder(local: Path, rel: str) -> Path:
    """The folder ``rel`` goes into under ``local``, made as needed; a part of it that is a link (or not
    a folder) is refused: the copy never writes through a link."""
    d = local
    for part in rel.split("/")[:-1]:
        d = d / part
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            d.mkdir()
            continue
        if stat.S_ISLNK(st.st_mode):
            raise CopyError(
                f"{d} is a symbolic link (to {os.readlink(d)}): refused, the copy never follows links"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise CopyError(f"{d} is in the way: not a folder")
    return d


def _open_part(part: Path, size: int) -> tuple[int, int]:
    """(fd, bytes to keep) of ``part``: a regular ``.part`` file of this copy resumed; anything else in its
    place (a planted link, a FIFO, a hard link to another file) removed without being opened, and a new
    one made exclusively with mode 0600."""
    try:
        st = os.lstat(part)
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > size):
        os.unlink(part)  # a link goes, its target is never touched
        st = None
    if st is None:
        return os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), 0
    fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
        os.close(fd)
        raise CopyError(f"{part} changed while being opened: refused")
    os.fchmod(fd, 0o600)
    return fd, now.st_size


def _safe_rel(rel: str) -> str:
    norm = posixpath.normpath(rel)
    if norm.startswith(("/", "../")) or norm == ".." or "\x00" in norm:
        raise CopyError(f"refusing a remote path outside the directory: {rel!r}")
    return norm


class _Copy:
    def __init__(self, need_helper, remote, local, on_progress, chunk, link_wait_s) -> None:
        self.need_helper = need_helper
        self.remote = remote
        self.local = local
        self.on_progress = on_progress
        self.chunk = chunk
        self.link_wait_s = link_wait_s
        self.reconnects = 0
        self.copied = 0
        self.done = 0
        self.total = 0
        self.files: list[dict] = []

    async def call(self, fn):
        """Run ``fn(helper)``; across a dropped link, wait for the next helper and run it again."""
        down_since = None
        while True:
            try:
                return await fn(self.need_helper())
            except HelperError:
                raise
            except (HelperGone, ConnectionError, OSError) as e:
                if down_since is None:
                    down_since = time.monotonic()
                    self.reconnects += 1
                elif time.monotonic() - down_since > self.link_wait_s:
                    raise CopyError(
                        f"the link stayed down for {self.link_wait_s:.0f} s; run the copy again to resume"
                    ) from e
                await asyncio.sleep(0.2)

    def progress(self, name: str, k: int) -> None:
        if self.on_progress is not None:
            self.on_progress(CopyProgress(self.done, self.total, name, k, len(self.files), self.reconnects))

    async def run(self) -> CopyResult:
        t0 = time.monotonic()
        try:
            self.files = await self.call(lambda h: h.call("tree", path=self.remote))
        except HelperError as e:
            raise CopyError(f"cannot list {self.remote}: {e}") from e
        self.total = sum(int(f["size"]) for f in self.files)
        self.local.mkdir(parents=True, exist_ok=True)
        try:
            for k, f in enumerate(self.files):
                await self.file(k, _safe_rel(f["rel"]), int(f["size"]), int(f.get("mode", 0o600)))
        except OSError as e:
            raise CopyError(f"cannot write into {self.local}: {e}") from e
        except HelperError as e:
            raise CopyError(
                f"{self.remote}: {e} (removed while copying? the trainer prunes old checkpoints)"
            ) from e
        return CopyResult(
            self.local, len(self.files), self.total, self.copied, self.reconnects, time.monotonic() - t0
        )

    async def file(self, k: int, rel: str, size: int, mode: int) -> None:
        """One file into its .part, resumed from the .part's size, verified, renamed."""
        path = posixpath.join(self.remote, rel)
        final = _folder(self.local, rel) / posixpath.basename(rel)
        part = final.with_name(final.name + PART)
        remote_hash = await self.call(lambda h: h.call("sha256", path=rel, root=self.remote))
        if _complete(final, size, remote_hash):
            self.done += size
            self.progress(rel, k + 1)
            return
        for attempt in range(2):
            fd, have = _open_part(part, size)
            try:
                await self.fill(fd, k, rel, have, size)
                if _sha256_fd(fd) == remote_hash:
                    os.fchmod(fd, mode & 0o644)  # the remote file's mode, never wider for group or other
                    os.replace(part, final)
                    self.progress(rel, k + 1)
                    return
            finally:
                os.close(fd)
            self.done -= size
            part.unlink()
            if attempt:
                raise CopyError(f"{path} does not match its remote SHA-256 twice: is it being written?")

    async def fill(self, fd: int, k: int, rel: str, have: int, size: int) -> None:
        """Write the remote file's bytes from ``have`` to ``size`` into ``fd`` (fsynced)."""
        os.ftruncate(fd, have)
        os.lseek(fd, have, os.SEEK_SET)
        self.done += have
        self.progress(rel, k)
        while have < size:
            n = min(self.chunk, size - have)
            data, _, _ = await self.call(lambda h, o=have, n=n: h.read(rel, o, n, root=self.remote))
            if not data:
                raise CopyError(f"{posixpath.join(self.remote, rel)} shrank while being copied")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            have += len(data)
            self.done += len(data)
            self.copied += len(data)
            self.progress(rel, k)
        os.fsync(fd)


async def copy_dir(
    need_helper: Callable[[], Helper],
    remote: str,
    local: Path | str,
    on_progress: Callable[[CopyProgress], None] | None = None,
    chunk: int = 1 << 20,
    link_wait_s: float = 300.0,
) -> CopyResult:
    """Copy the remote directory ``remote`` into ``local`` (created). ``need_helper()`` returns the live
    helper or raises while the link is down (``Session.need_helper``)."""
    return await _Copy(need_helper, remote, Path(local), on_progress, chunk, link_wait_s).run()
