"""A trained bench target between two device calls: packed into parts small enough to come back from a call,
unpacked (or copied) into the next call's work directory (bench_acceptance.py ``--save-target`` /
``--target-from``).

A call returns at most 8 files of at most 16 MiB each (the device tool's limits); a 15.5M-parameter target in
bf16 is a 31 MB safetensors file, so ``pack`` writes the target directory (flat: config, weights, tokenizer,
``bench_target.json``) as one uncompressed tar cut into ``target.tar.partNN`` files of ``PART_BYTES``. The
parts come back under the call's files; copied into an ignored folder of the checkout and named in the next
call's ``carry``, they travel there (the working tree's 64 MiB in all), and ``--target-from`` that folder
unpacks them. The tar is read as untrusted: regular files with plain names only, bounded in number and size;
no symbolic link is followed, in the parts or in a directory copied.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import tarfile

PART_BYTES = 15 * 2**20
PART_NAME = "target.tar.part{:02d}"
PART_RE = re.compile(r"target\.tar\.part(\d{2})")
FACTS = "bench_target.json"  # the target's training facts and the corpus it was trained on
MAX_FILES, MAX_BYTES = 64, 512 * 2**20
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class TransferError(Exception):
    pass


def _plain_files(src: str) -> list[str]:
    """The regular files directly in ``src`` (a symbolic link or a folder there is refused)."""
    names = sorted(os.listdir(src))
    for n in names:
        st = os.lstat(os.path.join(src, n))
        if not NAME_RE.fullmatch(n) or not stat.S_ISREG(st.st_mode):
            raise TransferError(f"{src}: {n!r} is not a plainly named regular file")
    if len(names) > MAX_FILES:
        raise TransferError(f"{src}: {len(names)} files, more than {MAX_FILES}")
    return names


def pack(src: str, dest: str, part_bytes: int = PART_BYTES) -> list[str]:
    """``src``'s files as one tar in ``dest/target.tar.partNN`` pieces of ``part_bytes``; their paths."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for n in _plain_files(src):
            tar.add(os.path.join(src, n), arcname=n, recursive=False)
    data = buf.getvalue()
    os.makedirs(dest, exist_ok=True)
    for n in os.listdir(dest):  # an earlier pack's parts (a warm machine's): none may outlive this one
        if PART_RE.fullmatch(n):
            os.remove(os.path.join(dest, n))
    paths = []
    for i in range(0, len(data), part_bytes):
        paths.append(os.path.join(dest, PART_NAME.format(i // part_bytes)))
        with open(paths[-1], "wb") as f:
            f.write(data[i : i + part_bytes])
    return paths


def _read_parts(src: str) -> bytes:
    parts = sorted((int(m.group(1)), n) for n in os.listdir(src) if (m := PART_RE.fullmatch(n)))
    if [i for i, _ in parts] != list(range(len(parts))) or not parts:
        raise TransferError(f"{src}: target.tar.part00.. missing or not consecutive")
    chunks, total = [], 0
    for _, n in parts:
        p = os.path.join(src, n)
        if not stat.S_ISREG(os.lstat(p).st_mode):
            raise TransferError(f"{p}: not a regular file")
        total += os.path.getsize(p)
        if total > MAX_BYTES:
            raise TransferError(f"{src}: the parts hold more than {MAX_BYTES} bytes")
        with open(p, "rb") as f:
            chunks.append(f.read())
    return b"".join(chunks)


def unpack(src: str, dest: str) -> None:
    """The tar in ``src``'s parts into the new directory ``dest``: plain regular files only."""
    with tarfile.open(fileobj=io.BytesIO(_read_parts(src)), mode="r:") as tar:
        members = tar.getmembers()
        if len(members) > MAX_FILES:
            raise TransferError(f"{src}: {len(members)} files in the tar, more than {MAX_FILES}")
        bad = [m.name for m in members if not (m.isreg() and NAME_RE.fullmatch(m.name))]
        if bad:
            raise TransferError(f"{src}: tar entries not plainly named regular files: {bad[:4]}")
        os.makedirs(dest)
        for m in members:
            with tar.extractfile(m) as fin, open(os.path.join(dest, m.name), "xb") as fout:
                shutil.copyfileobj(fin, fout)


def fetch_target(src: str, dest: str) -> dict:
    """The trained target at ``src`` (a transformers directory with ``bench_target.json``, or a folder of
    ``pack``'s parts) as the new directory ``dest``; its facts (``bench_target.json``)."""
    if not os.path.isdir(src) or os.path.islink(src):
        raise TransferError(f"--target-from {src}: not a directory")
    if os.path.isfile(os.path.join(src, "config.json")):
        os.makedirs(dest)
        for n in _plain_files(src):
            shutil.copyfile(os.path.join(src, n), os.path.join(dest, n), follow_symlinks=False)
    else:
        unpack(src, dest)
    try:
        with open(os.path.join(dest, FACTS), encoding="utf-8") as f:
            facts = json.load(f)
    except (OSError, ValueError) as e:
        raise TransferError(
            f"--target-from {src}: no readable {FACTS} ({e}): not a target this bench saved"
        ) from e
    if not isinstance(facts, dict) or not isinstance(facts.get("target"), dict):
        raise TransferError(f"--target-from {src}: {FACTS} has no target facts")
    return facts
