"""Atomic checkpoints: ``checkpoints/step_NNNNNNNN/`` complete or absent, ``checkpoints/latest`` naming one.

A save writes into ``step_NNNNNNNN.tmp-PID-XXXX/``, fsyncs every file and the folder, renames it to
``step_NNNNNNNN/``, fsyncs ``checkpoints/``, then replaces ``latest`` atomically. The last file written
into the temp folder is ``manifest.json`` (every other file's size and SHA-256), so ``is_complete`` can tell
a whole checkpoint from anything else, and ``verify`` a sound one from a damaged one (a manifest of an older
trainer has sizes only: those are what it checks). A SIGKILL at any point leaves ``latest`` naming the
previous complete one. A save of step N where a ``step_N/`` that does not verify is in the way moves that one
aside (``set_aside``: ``step_N.bad``, never pruned nor overwritten) instead of deleting it.

A save that fails anywhere (the payload's writers, the manifest, the fsyncs, the renames, ``latest``) is one
failed save: ``SaveFailed`` (an ``OSError``), its folder removed, ``latest`` as it was. The payload's writers
do not all raise ``OSError`` on a full disk: safetensors raises ``SafetensorError`` ("No space left on device
(os error 28)"), ``torch.save`` a ``RuntimeError`` ("unexpected pos ..."); both are taken as the write failing.

``on_stage(stage, path)`` is called at each of ``STAGES``: a no-op here; tests replace it in-process (or
through their own module on PYTHONPATH, tests/support/fault_site) to pause or fail a save at that point.
Nothing in the environment changes what a save does.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable

from trainer.run.rundir import atomic_write_text, fsync_dir, own_dir

STAGES = (
    "tmp_created",  # empty temp folder exists
    "files_written",  # payload written, not yet synced, no manifest
    "synced",  # payload + manifest written and fsynced, still under the temp name
    "renamed",  # step_N/ in place, latest still names the previous one
    "latest_tmp_written",  # the new latest is written and fsynced under a temp name, not yet renamed
    "latest_written",  # latest names step_N
)
STEP_RE = re.compile(r"^step_(\d{8,})$")
MANIFEST = "manifest.json"
BEST = "best"  # checkpoints/best: the checkpoint the evaluations found best (--keep-best), never pruned


def on_stage(stage: str, path: str) -> None:
    """Called at each of ``STAGES`` of a save (a seam for tests; does nothing)."""


class SaveFailed(OSError):
    """A save that did not complete; its ``errno`` is the write's (ENOSPC for a full disk) where known."""


_OS_ERROR = re.compile(r"os error (\d+)")


def _write_failed(e: Exception, tmp: str) -> SaveFailed:
    """A payload writer's own error (safetensors' ``SafetensorError``, ``torch.save``'s ``RuntimeError``) as
    the ``OSError`` it stands for: the errno its text names, else ENOSPC where the disk is (nearly) full, else
    EIO; the writer's text kept."""
    m = _OS_ERROR.search(str(e))
    if m:
        code = int(m.group(1))
    else:
        try:
            st = os.statvfs(tmp)
            code = errno.ENOSPC if st.f_bavail * st.f_frsize < (1 << 20) else errno.EIO
        except OSError:
            code = errno.EIO
    return SaveFailed(code, f"{os.strerror(code)} ({type(e).__name__}: {e})", tmp)


def _payload_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:
        return (RuntimeError,)
    return (RuntimeError, SafetensorError)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _walk_files(root: str) -> list[str]:
    out = []
    for d, _dirs, files in os.walk(root):
        for fn in files:
            out.append(os.path.relpath(os.path.join(d, fn), root))
    return sorted(out)


def _fsync_tree(root: str) -> None:
    for d, _dirs, files in os.walk(root):
        for fn in files:
            fd = os.open(os.path.join(d, fn), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(d)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)  # hashlib releases the GIL: the files of a checkpoint hash in parallel
    return h.hexdigest()


def checksums(root: str, rels: list[str]) -> dict[str, str]:
    """``{rel: sha256}`` of the files, hashed in parallel threads (one per file, at most 8)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(8, len(rels)))) as pool:
        digests = pool.map(lambda rel: sha256_file(os.path.join(root, rel)), rels)
        return dict(zip(rels, digests, strict=True))


def verify(path: str) -> str | None:
    """None when ``path`` is a sound checkpoint (its manifest, every file it lists at the listed size and,
    where it records them, SHA-256); else what is wrong, naming the file."""
    mpath = os.path.join(path, MANIFEST)
    try:
        man = read_manifest(path)
        files, sums = man["files"], man.get("sha256", {})
        if not isinstance(files, dict) or not isinstance(sums, dict) or not files:
            return f"{mpath}: no list of files"
    except OSError as e:
        return f"{mpath}: {e.strerror or e}"
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{mpath}: not a checkpoint manifest"
    for rel, size in files.items():
        p = os.path.join(path, rel)
        try:
            got = os.path.getsize(p)
        except OSError as e:
            return f"{p}: {e.strerror or e}"
        if got != size:
            return f"{p}: {got} bytes, the manifest says {size}"
    try:
        actual = checksums(path, [rel for rel in files if rel in sums])
    except OSError as e:
        return f"{path}: {e.strerror or e} while checking its files"
    bad = next((rel for rel, digest in actual.items() if digest != sums[rel]), None)
    return None if bad is None else f"{os.path.join(path, bad)}: its SHA-256 differs from the manifest's"


def set_aside(path: str) -> str:
    """Rename a checkpoint folder that does not verify to ``NAME.bad`` (``.bad-2``...: never over another):
    out of ``list_steps``, so never pruned, overwritten or resumed. Returns the new path."""
    n = 1
    while os.path.lexists(dest := f"{path}.bad" + (f"-{n}" if n > 1 else "")):
        n += 1
    os.rename(path, dest)  # one trainer owns a run dir at a time: nothing else creates dest meanwhile
    return dest


def is_complete(path: str) -> bool:
    """True if ``path`` holds a manifest and every file it lists, at the listed size."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            man = json.load(f)
        return all(os.path.getsize(os.path.join(path, rel)) == size for rel, size in man["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def read_manifest(path: str) -> dict:
    with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def latest(ckpt_root: str) -> str | None:
    """The newest complete checkpoint: the one ``latest`` names, else the highest complete step_N."""
    try:
        with open(os.path.join(ckpt_root, "latest"), encoding="utf-8") as f:
            name = f.read().strip()
        p = os.path.join(ckpt_root, name)
        if name and STEP_RE.match(name) and is_complete(p):
            return p
    except OSError:
        pass
    for name in sorted(list_steps(ckpt_root), reverse=True):
        p = os.path.join(ckpt_root, name)
        if is_complete(p):
            return p
    return None


def list_steps(ckpt_root: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(ckpt_root) if STEP_RE.match(n))
    except FileNotFoundError:
        return []


def remove_partial(ckpt_root: str) -> list[str]:
    """Delete temp folders left by killed saves (only one trainer owns a run dir at a time)."""
    gone = []
    try:
        names = os.listdir(ckpt_root)
    except FileNotFoundError:
        return gone
    for n in names:
        p = os.path.join(ckpt_root, n)
        if ".tmp-" in n or n.startswith(".trash-"):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(n)
        elif n.startswith(".latest.") and n.endswith(".tmp"):
            os.unlink(p)
            gone.append(n)
    return gone


def save(
    ckpt_root: str, step: int, write_payload: Callable[[str], None], meta: dict, keep: int = 2
) -> tuple[str, int]:
    """Write a checkpoint atomically; return (final path, bytes). ``write_payload(tmpdir)`` writes the files.

    Any failure (a full disk: ``OSError`` ENOSPC) removes the temp folder and raises; ``latest`` and the
    complete checkpoints are untouched. Older checkpoints are pruned to ``keep`` only after the new one
    is complete and ``latest`` names it.
    """
    os.makedirs(os.path.dirname(ckpt_root), exist_ok=True)
    own_dir(
        ckpt_root
    )  # a link planted in its place is refused (LinkRefused: an OSError), never written through
    name = step_dir_name(step)
    final = os.path.join(ckpt_root, name)
    tmp = os.path.join(ckpt_root, f"{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    try:
        on_stage("tmp_created", tmp)
        try:
            write_payload(tmp)
        except _payload_errors() as e:
            raise _write_failed(e, tmp) from e
        on_stage("files_written", tmp)
        rels = _walk_files(tmp)
        files = {rel: os.path.getsize(os.path.join(tmp, rel)) for rel in rels}
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump({**meta, "step": step, "files": files, "sha256": checksums(tmp, rels)}, f, indent=1)
        _fsync_tree(tmp)
        on_stage("synced", tmp)
        trash = _make_way(ckpt_root, final)
        os.rename(tmp, final)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        fsync_dir(ckpt_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    on_stage("renamed", final)
    try:
        atomic_write_text(
            os.path.join(ckpt_root, "latest"),
            name + "\n",
            before_rename=lambda: on_stage("latest_tmp_written", final),
        )
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)  # latest does not name it: the save failed as a whole
        raise
    on_stage("latest_written", final)
    nbytes = sum(files.values()) + os.path.getsize(os.path.join(final, MANIFEST))
    _prune(ckpt_root, keep, newest=name)
    return final, nbytes


def _make_way(ckpt_root: str, final: str) -> str | None:
    """An earlier save of this step that ``latest`` does not name: moved to a trash name (returned; deleted
    once the new one is in place) where it verifies; set aside (``set_aside``) where it does not, so that a
    damaged checkpoint's intact files (its drafter weights, say) are never lost."""
    if not os.path.lexists(final):
        return None
    if verify(final) is not None:
        set_aside(final)
        return None
    trash = os.path.join(ckpt_root, f".trash-{os.path.basename(final)}-{uuid.uuid4().hex[:8]}")
    os.rename(final, trash)
    return trash


def read_pointer(ckpt_root: str, name: str) -> str | None:
    """The checkpoint folder name a pointer file (``latest``, ``best``) holds: read without following a link
    (a link in its place reads as none), at most 200 bytes; None where absent or not a step name."""
    try:
        fd = os.open(
            os.path.join(ckpt_root, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    try:
        text = os.read(fd, 200).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text if STEP_RE.match(text) else None


def _prune(ckpt_root: str, keep: int, newest: str) -> None:
    if keep <= 0:
        return
    names = [n for n in list_steps(ckpt_root) if n != newest]
    # listed before ``best`` is read: a checkpoint made best (and restored) after this listing is not in it
    best = read_pointer(ckpt_root, BEST)
    names = [n for n in names if n != best]  # the best evaluated one is kept beside the newest ``keep``
    for n in names[: max(0, len(names) - (keep - 1))]:
        shutil.rmtree(os.path.join(ckpt_root, n), ignore_errors=True)
