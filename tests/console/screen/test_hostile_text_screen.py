"""The screen shows the container's text clean (issue 33, item 1): a live session against the in-process
SSH server, a trainer whose command line, a checkpoint directory's name, a throughput record and the GPU
names nvidia-smi prints hold OSC 52, OSC 0, CSI and C1 controls; the GPU table, the checkpoints view and
the stop dialog show none of them."""

from __future__ import annotations

import json

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from console.screens.checkpoints_dialog import CheckpointsScreen
from console.screens.stop_dialog import StopDialog
from tests.support.core_util import CT, options_for, start_user_script
from tests.support.devhost import devhost_thread
from tests.support.screen_text import screen_text, until

pytestmark = pytest.mark.e2e

SIZE = (140, 40)
TITLE = "\x1b]0;pwned\x07"
# bidi override and zero-width space last
HOSTILE = "<\x1b]52;c;aGVsbG8=\x1b\\\x1b]0;pwned\x07\x1b[2J\x9b6n\x9d0;t\x9c\u202e\u200b>"
UUID = f"GPU-7{TITLE}"
# nvidia-smi's CSV (console/core/telemetry.py), its uuid and name hostile: ESC as \033, C1 as UTF-8 \302\2xx
SMI = r"""#!/bin/sh
line='0, GPU-7\033]0;pwned\007, H200 \302\2332J\302\23552;c;eA==\302\234, 50, 1000, 80000, 300, 60\n'
case "$*" in *-lms*) while :; do printf "$line"; sleep 0.2; done;; *) printf "$line";; esac
"""


def unsafe(text: str) -> list[str]:
    """Controls a terminal acts on, and the bidi and zero-width characters it shows invisibly."""
    return [
        c for c in text if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u200b"
    ]


@pytest.fixture
def hostile(tmp_path):
    with devhost_thread(tmp_path / "dh") as h:
        folder = h.container_dir(CT)
        smi = h.host.bin_dir / "nvidia-smi"
        smi.write_text(SMI)
        smi.chmod(0o755)
        run = folder / "run"
        (run / "checkpoints" / f"step_1{TITLE}").mkdir(parents=True)
        dev = {"device": f"cuda:0{HOSTILE}", "uuid": UUID, "role": "drafter", "tok_s": 10.0, "busy": 0.5}
        (run / "metrics.jsonl").write_text(
            json.dumps(
                {"t": 1.0, "kind": "throughput", "devices": [dev], "queue": {"depth": 1, "capacity": 2}}
            )
            + "\n"
        )
        (run / "train.log").write_text("")
        p = start_user_script(folder, str(run), args=("--tag", HOSTILE))
        try:
            yield h, run, p
        finally:
            p.kill()
            p.wait()


async def test_gpu_table_checkpoints_and_stop_dialog_show_clean_text(hostile):
    h, run, p = hostile
    session = Session(options_for(h), place=Proxmox(CT), run_dir=str(run))
    app = ConsoleApp(session, target=f"devhost · CT {CT}")
    async with app.run_test(size=SIZE) as pilot:
        st = app.state
        await until(pilot, lambda: st.trainer is not None and st.gpus, 30, "the trainer and the GPUs")
        await until(pilot, lambda: any("H200" in c for row in app.w_gpus.cells() for c in row), 10, "GPU row")
        # what the core hands the screen is clean, and so is what the screen draws
        assert not unsafe(" ".join(st.trainer.cmdline) + "".join(g.name + g.uuid for g in st.gpus))
        assert not unsafe(str(app.w_gpus.cells())) and "drafter" in str(app.w_gpus.cells())
        assert not unsafe(screen_text(app))

        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CheckpointsScreen), 10, "the checkpoints view")
        await until(pilot, lambda: "step_1" in screen_text(app), 30, "the checkpoint listed")  # poked: now
        assert not unsafe("".join(c.name + c.path for c in st.disk.checkpoints))
        assert not unsafe(screen_text(app)), screen_text(app)
        await pilot.press("escape")

        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, StopDialog), 10, "the stop dialog")
        text = screen_text(app)
        assert f"PID {p.pid}" in text and "--tag" in text and not unsafe(text), text
        assert "\\u202e\\u200b>" in text  # the invisible characters: shown as escapes
        await pilot.press("escape")
    assert p.poll() is None  # nothing was stopped
