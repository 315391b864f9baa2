"""Copy a remote directory (an exported drafter) to this machine over the session's one SSH
connection, through the helper (``tree``, ``read``, ``sha256``), with progress; a dropped link is
waited out (the session reconnects by itself) and the copy resumes where it stopped.

Each file is written to ``NAME.part`` beside its final name and renamed only when its size and
SHA-256 match the remote file's, so the destination never holds a torn file under its real name, and a
copy started again later (even by another console) skips what is complete and resumes each ``.part``
from its size. A ``.part`` longer than the remote file, or a file whose hash does not match, starts
over once; a second mismatch is an error (the remote file is changing).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
                await self.file(k, _safe_rel(f["rel"]), int(f["size"]))
        except HelperError as e:
            raise CopyError(
                f"{self.remote}: {e} (removed while copying? the trainer prunes old checkpoints)"
            ) from e
        return CopyResult(
            self.local, len(self.files), self.total, self.copied, self.reconnects, time.monotonic() - t0
        )

    async def file(self, k: int, rel: str, size: int) -> None:
        """One file into its .part, resumed from the .part's size, verified, renamed."""
        path = posixpath.join(self.remote, rel)
        final = self.local / rel
        part = final.with_name(final.name + PART)
        final.parent.mkdir(parents=True, exist_ok=True)
        remote_hash = await self.call(lambda h: h.call("sha256", path=path))
        if final.exists() and final.stat().st_size == size and _sha256(final) == remote_hash:
            self.done += size
            self.progress(rel, k + 1)
            return
        for attempt in range(2):
            have = part.stat().st_size if part.exists() else 0
            if have > size:
                have = 0
            with open(part, "r+b" if have else "wb") as out:
                out.truncate(have)
                out.seek(have)
                self.done += have
                self.progress(rel, k)
                while have < size:
                    n = min(self.chunk, size - have)
                    data, _, _ = await self.call(lambda h, o=have, n=n: h.read(path, o, n))
                    if not data:
                        raise CopyError(f"{path} shrank while being copied")
                    out.write(data)
                    have += len(data)
                    self.done += len(data)
                    self.copied += len(data)
                    self.progress(rel, k)
                out.flush()
                os.fsync(out.fileno())
            if _sha256(part) == remote_hash:
                os.replace(part, final)
                self.progress(rel, k + 1)
                return
            self.done -= have
            part.unlink()
            if attempt:
                raise CopyError(f"{path} does not match its remote SHA-256 twice: is it being written?")


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
