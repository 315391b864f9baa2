"""Copying a remote drafter directory over the session's connection (console/core/transfer.py): the
link drops twice mid-copy (the devhost restarts), the copy waits for the session's reconnect, resumes
from its .part files and ends byte-identical; a second copy moves nothing; a torn .part restarts."""

from __future__ import annotations

import asyncio
import os

import pytest

from console.core.session import Session
from console.core.transfer import PART, CopyError, copy_dir
from console.devhost import DevHost
from tests.support.core_util import CT, options_for


@pytest.fixture
async def host(tmp_path):
    async with DevHost(tmp_path / "host") as h:
        h.add_container(CT)
        yield h


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

    async with Session(options_for(host), ct=CT, telemetry=False, streams=False) as s:

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
