"""The drafter's architecture as the console shows it: from run.json's argv, in the panel and in status."""

from __future__ import annotations

from console.core.drafter_arch import drafter_arch
from console.core.state import ConsoleState
from console.core.status import format_text
from console.widgets.training_panel import panel_text


def run(*flags: str) -> dict:
    return {"argv": ["--target-model", "t", "--data-dir", "d", "--output-dir", "o", *flags]}


def test_arch_and_block_from_argv_with_the_trainers_defaults():
    assert drafter_arch(run()) == {"arch": "dflash", "name": "DFlash 1", "block_size": 16}
    assert drafter_arch(run("--arch", "dflash2")) == {"arch": "dflash2", "name": "DFlash 2", "block_size": 8}
    assert drafter_arch(run("--arch=dflash2", "--block-size", "12"))["block_size"] == 12
    assert drafter_arch(run("--arch", "dflash2", "--arch", "dflash"))["name"] == "DFlash 1"  # last wins
    assert drafter_arch(None) is None and drafter_arch({"pid": 1}) is None


def test_the_trainers_resolved_settings_win_over_argv():
    # a resume without --arch: the trainer took DFlash 2, block 8 from the checkpoint and says so in run.json
    resumed = {
        **run("--resume", "auto"),
        "drafter": {"arch": "dflash2", "block_size": 8, "num_draft_layers": 2},
    }
    assert drafter_arch(resumed) == {"arch": "dflash2", "name": "DFlash 2", "block_size": 8}


def test_panel_and_status_show_it():
    st = ConsoleState(clock=lambda: 0.0)
    st.last_run = run("--arch", "dflash2")
    assert "drafter    DFlash 2 (block 8)" in panel_text(st).plain
    st.last_run = None
    assert "drafter    -" in panel_text(st).plain
    status = {
        "host": "h",
        "ct": None,
        "helper": {"pid": 1, "hostname": "x"},
        "trainer": None,
        "run_dir": "/r",
        "drafter": drafter_arch(run("--arch", "dflash2", "--block-size", "16")),
        "last_step": None,
        "throughput": None,
        "last_checkpoint": None,
        "last_event": None,
        "gpus": None,
        "gpu_detail": "",
        "t": 0.0,
    }
    assert "drafter: DFlash 2 (block 16)" in format_text(status).splitlines()
