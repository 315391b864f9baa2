"""Copying a remote drafter directory over the session's connection (console/core/transfer.py): the
link drops twice mid-copy (the devhost restarts), the copy waits for the session's reconnect, resumes
from its .part files and ends byte-identical; a second copy moves nothing; a torn .part restarts."""

from __future__ import annotations

import asyncio
import os

import pytest

from console.core.place import Proxmox
from console.core.session import Session
from console.core.transfer import PART, CopyError, copy_dir
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True)


def make_export(root):
    d = root / "run" / "checkpoints" / "step_00000040" / "export"
    (d / "sub").mkdir(parents=True)
    files = {
        "model.safetensors": os.urandom(3 << 20),
        "config.json": b'{"block_size": 8}\n',
        "sub/empty": b"",
        "sub/tokenizer.json": os.urandom(70_000),
    }
    for rel, data in files.items():
        (d / rel).write_bytes(data)
    return d, files


async def test_copy_survives_two_dropped_links_and_ends_byte_identical(host, tmp_path):
    src, files = make_export(host.container_dir(CT))
    dest = tmp_path / "local" / "drafter"
    seen = []
    drops = []

    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:

        def on_progress(p):
            seen.append(p)
            # drop the link twice while the big file is a third and two thirds through
            if (
                p.file == "model.safetensors"
                and len(drops) < 2
                and p.done_bytes > (len(drops) + 1) * (1 << 20)
            ):
                drops.append(asyncio.get_running_loop().create_task(host.restart(pause=0.2)))

        res = await asyncio.wait_for(
            copy_dir(s.need_helper, str(src), dest, on_progress, chunk=256 << 10), 120
        )
        await asyncio.gather(*drops)
        assert len(drops) == 2 and res.reconnects >= 2
        for rel, data in files.items():
            assert (dest / rel).read_bytes() == data, rel
        assert not list(dest.rglob("*" + PART))
        assert res.files == 4 and res.bytes == sum(map(len, files.values()))
        assert res.copied_bytes < res.bytes + 2 * (256 << 10)  # resumed, not started over
        assert seen[-1].done_bytes == res.bytes and seen[-1].files_done == 4
        assert all(a.done_bytes <= b.done_bytes for a, b in zip(seen, seen[1:], strict=False))

        # again: everything is there already, nothing moves
        again = await copy_dir(s.need_helper, str(src), dest)
        assert again.copied_bytes == 0

        # a .part left by an interrupted copy that does not match (torn, longer): started over cleanly
        (dest / "config.json").unlink()
        (dest / ("config.json" + PART)).write_bytes(b"x" * 100)
        (dest / "sub" / "tokenizer.json").unlink()
        (dest / "sub" / ("tokenizer.json" + PART)).write_bytes(b"garbage")
        await copy_dir(s.need_helper, str(src), dest)
        for rel, data in files.items():
            assert (dest / rel).read_bytes() == data, rel
        assert not list(dest.rglob("*" + PART))

        with pytest.raises(CopyError, match="cannot list"):
            await copy_dir(s.need_helper, str(src / "nope"), tmp_path / "x")


async def test_a_symlinked_export_or_entry_is_refused_naming_its_target(host, tmp_path):
    """An export/ that is a link to a folder holding a 0600 key, or an export holding a link to it, copies
    nothing: the copy is refused and the refusal names the link's target."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_ed25519").write_bytes(b"PRIVATE KEY")
    (secret / "id_ed25519").chmod(0o600)
    step = host.container_dir(CT) / "run" / "checkpoints" / "step_00000040"
    step.mkdir(parents=True)
    (step / "export").symlink_to(secret)
    other = host.container_dir(CT) / "other_export"
    other.mkdir()
    (other / "config.json").write_bytes(b"{}")
    (other / "key").symlink_to(secret / "id_ed25519")
    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:
        with pytest.raises(CopyError, match=f"is a symbolic link \\(to {secret}\\)"):
            await copy_dir(s.need_helper, str(step / "export"), tmp_path / "a")
        with pytest.raises(CopyError, match=f"key is a symbolic link \\(to {secret / 'id_ed25519'}\\)"):
            await copy_dir(s.need_helper, str(other), tmp_path / "b")
        ck = await s.need_helper().call("checkpoints", path=str(step.parent.parent))
    copied = [p for d in ("a", "b") for p in (tmp_path / d).rglob("*") if p.is_file()]
    assert not [p for p in copied if p.read_bytes() == b"PRIVATE KEY"], copied  # the key never arrived
    (entry,) = ck["entries"]
    assert entry["export"] is None and str(secret) in entry["export_refused"]  # the checkpoints view says it


async def test_a_planted_part_symlink_is_never_written_through_and_modes_stay_narrow(host, tmp_path):
    """DEST/NAME.part planted as a link to a file of the operator's: the copy removes the link and writes
    its own .part (the target keeps its bytes); a 0600 remote file arrives 0600, a 0755 one 0644."""
    src = host.container_dir(CT) / "export"
    src.mkdir()
    (src / "adapter.bin").write_bytes(b"weights" * 1000)
    (src / "adapter.bin").chmod(0o600)
    (src / "run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ("adapter.bin" + PART)).symlink_to(victim)
    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:
        await copy_dir(s.need_helper, str(src), dest)
    assert victim.read_bytes() == b"precious"
    assert (dest / "adapter.bin").read_bytes() == b"weights" * 1000 and not (
        dest / "adapter.bin"
    ).is_symlink()
    assert (dest / "adapter.bin").stat().st_mode & 0o777 == 0o600
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o644
    assert not list(dest.rglob("*" + PART))


async def test_a_symlinked_folder_in_the_destination_is_refused(host, tmp_path):
    src = host.container_dir(CT) / "export"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "tokenizer.json").write_bytes(b"{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:
        with pytest.raises(CopyError, match=f"sub is a symbolic link \\(to {elsewhere}\\)"):
            await copy_dir(s.need_helper, str(src), dest)
    assert not list(elsewhere.iterdir())


async def test_a_fifo_in_the_export_is_refused_at_once(host, tmp_path):
    src = host.container_dir(CT) / "export"
    src.mkdir()
    (src / "config.json").write_bytes(b"{}")
    os.mkfifo(src / "model.safetensors")
    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:
        with pytest.raises(CopyError, match="model.safetensors is a FIFO, not a regular file"):
            await asyncio.wait_for(copy_dir(s.need_helper, str(src), tmp_path / "dest"), 60)
