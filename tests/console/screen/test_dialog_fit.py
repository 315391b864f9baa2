"""At 130 columns nothing in the dialogs is cut mid-word: help wraps its descriptions, the stop dialog
shows the trainer's full command line, the checkpoints view elides a long drafter path in the middle
and shows the selected one in full. The checkpoints view stays live while open, and ``y`` proposes a
place under the console's data directory (never the current directory unasked)."""

from pathlib import Path

from textual.widgets import Label

from console.app import ConsoleApp
from console.core.events import CheckpointEntry, ConnState, DiskInfo, Record, TrainerFound, TrainerInfo
from console.core.place import HOST, Proxmox, Slurm
from console.core.state import ConsoleState
from console.screens.checkpoints_dialog import CheckpointsScreen, default_dest, elide_middle
from console.screens.help import HelpScreen
from console.screens.launch_dialog import LaunchDialog
from console.screens.stop_dialog import StopDialog
from tests.support.records import T0, step
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)
RUN = "/root/dflash/runs/an-ablation-with-a-long-name-2026-12-02"


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 60

    def __call__(self) -> float:
        return self.now


def _app(clock=None) -> ConsoleApp:
    clock = clock or Clock()
    return ConsoleApp(None, state=ConsoleState(clock=clock), target="127.0.0.1 · CT 200", clock=clock)


class Connected:
    """What the screen calls of a connected session here (nothing is launched or copied)."""

    def __init__(self, place=HOST) -> None:
        self.place = place

    async def close(self) -> None:
        pass

    async def launch(self, *args, **kw):
        raise AssertionError("not launched in these tests")


def _words(text: str) -> str:
    return " ".join(text.split())


def _region_text(app, widget) -> str:
    """What the screen shows inside ``widget`` (the lines of a wrapped text, joined by _words)."""
    r = widget.region
    lines = screen_text(app).splitlines()[r.y : r.y + r.height]
    return "\n".join(line[r.x : r.x + r.width] for line in lines)


async def test_help_wraps_every_description_in_full():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "…" not in text, text
        for _key, _title, tip in app.help_rows():
            last = tip.split()[-1]
            assert last in text, f"{tip!r} is cut:\n{text}"  # e.g. "(silent until it clears)" whole
        tips = _words(_region_text(app, app.screen.query_one("#keys")))
        assert "silent until it clears" in tips and "y copies a drafter to this machine" in tips, tips


async def test_stop_dialog_shows_the_full_command_line():
    flags = [f"--flag-number-{i} value-{i}" for i in range(24)] + ["--log-every 50"]
    cmd = ["/usr/bin/python3", "-m", "trainer.pipeline", *" ".join(flags).split()]
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(
            [
                ConnState("connected"),
                TrainerFound(TrainerInfo(4242, 99, cmd, RUN, "run.json", {})),
                Record(step(T0, 7)),
            ]
        )
        await pilot.press("s")
        assert isinstance(app.screen, StopDialog)
        await pilot.pause(0.1)
        text = _words(_region_text(app, app.screen.query_one("#summary")))
        assert "--log-every 50" in text and "…" not in text, text
        assert "--flag-number-23 value-23" in text


async def test_launch_dialog_labels_wrap_in_full():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.session = Connected()
        await pilot.press("l")
        assert isinstance(app.screen, LaunchDialog)
        await pilot.pause(0.1)
        for label in app.screen.query(Label):
            words = str(label.render()).split()
            shown = _words(_region_text(app, label))
            assert shown == " ".join(words), (shown, words)


async def test_the_launch_dialog_says_when_a_scheduler_takes_the_launch():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.session = Connected(Slurm("dflash"))
        await pilot.press("l")
        await pilot.pause(0.1)
        assert "submitted as a new Slurm job dflash (sbatch)" in _words(screen_text(app))
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.session = Connected(Proxmox(200))
        await pilot.press("l")
        await pilot.pause(0.1)
        assert isinstance(app.screen, LaunchDialog) and "submitted as" not in screen_text(app)


def _disk(now: float, steps=(200, 400)) -> DiskInfo:
    entries = [
        CheckpointEntry(
            name=f"step_{s:08d}",
            path=f"{RUN}/checkpoints/step_{s:08d}",
            step=s,
            bytes=600_000,
            mtime=now - 10 * (len(steps) - i),
            complete=True,
            latest=i == len(steps) - 1,
            export=f"{RUN}/checkpoints/step_{s:08d}/export/drafter-for-serving",
        )
        for i, s in enumerate(steps)
    ]
    return DiskInfo(RUN, 10**11, 2 * 10**11, entries, latest=entries[-1].name, keep=2, t=now)


class Watch:
    def __init__(self) -> None:
        self.pokes = 0

    def poke(self) -> None:
        self.pokes += 1

    async def stop(self) -> None:
        pass


async def test_checkpoints_view_elides_the_drafter_path_and_shows_the_selected_one_in_full():
    clock = Clock()
    app = _app(clock)
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _disk(clock.now)])
        await pilot.press("c")
        assert isinstance(app.screen, CheckpointsScreen)
        await pilot.pause(0.2)
        text = screen_text(app)
        full = f"{RUN}/checkpoints/step_00000400/export/drafter-for-serving"
        assert full in _words(text.replace("█", " ")), text  # the selected (latest) one, whole
        # in the table: relative to the run dir, with its end (the part that differs) kept
        assert "checkpoints/step_00000200/export/drafter-for-serving" in text, text
        assert elide_middle("abcdefghij", 5) == "ab…ij"


async def test_checkpoints_view_ticks_and_looks_again_after_a_save():
    clock = Clock()
    app = _app(clock)
    watch = Watch()
    async with app.run_test(size=SIZE) as pilot:
        app.health_hooks.watch = watch
        app.feed([ConnState("connected"), _disk(clock.now)])
        await pilot.press("c")
        await pilot.pause(0.2)
        assert "10 s ago" in screen_text(app)
        figures = [ln for ln in screen_text(app).splitlines() if "(looked" in ln or "free " in ln]
        assert len(figures) == 1, figures  # free space, keep-count and the scan's age: one line, never cut
        assert "free 93.1 GB of 186.3 GB" in figures[0] and "(looked 0 s ago)" in figures[0], figures
        clock.now += 30  # no new scan: the ages move anyway
        await until(pilot, lambda: "40 s ago" in screen_text(app), 5, "the ages to tick")
        pokes = watch.pokes
        app.feed([Record({"t": clock.now, "kind": "event", "name": "checkpoint_saved", "step": 600})])
        await until(pilot, lambda: watch.pokes > pokes, 5, "a scan after the save")
        app.feed([_disk(clock.now, steps=(400, 600))])  # what that scan finds
        await until(pilot, lambda: "step_00000600" in screen_text(app), 5, "the new checkpoint listed")


def test_y_proposes_a_place_under_the_data_directory(tmp_path):
    entry = _disk(T0).checkpoints[-1]
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    dest = default_dest(RUN, entry, env)
    assert dest == tmp_path / "data" / "dflash-console" / "drafters" / f"{Path(RUN).name}-step_00000400"
    assert default_dest(RUN, entry, {"HOME": str(tmp_path)}).is_relative_to(tmp_path / ".local" / "share")


async def test_y_says_where_it_will_write_and_the_copy_line_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    clock = Clock()
    app = _app(clock)
    async with app.run_test(size=SIZE) as pilot:
        app.session = Connected()  # (the copy itself is console/core/transfer.py's)
        app.feed([ConnState("connected"), _disk(clock.now)])
        await pilot.press("c")
        await pilot.pause(0.2)
        assert str(tmp_path / "data" / "dflash-console" / "drafters") in _words(screen_text(app))
        await pilot.press("y")
        await pilot.pause(0.1)
        dest = app.screen.query_one("#dest")
        assert dest.value == str(
            tmp_path / "data" / "dflash-console" / "drafters" / f"{Path(RUN).name}-step_00000400"
        )


async def test_checkpoints_view_says_why_a_checkpoint_is_not_offered():
    clock = Clock()
    app = _app(clock)
    disk = _disk(clock.now)
    last = disk.checkpoints[-1]
    last.export, last.refused = None, f"{last.path}/export is a symbolic link (to /root/.ssh): refused"
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), disk])
        await pilot.press("c")
        await pilot.pause(0.2)
        text = _words(screen_text(app).replace("█", " "))
        assert "not offered" in text and "(to /root/.ssh)" in text, text
