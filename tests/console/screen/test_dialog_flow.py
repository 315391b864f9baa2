"""Dialogs that are done get out of the way: a finished stop lets the screen's keys work again (a
modal screen keeps every app key from the app, silently), and a launch that succeeded closes its
dialog and the screen says once what started. Fed without a host, at 130x40."""

from console.app import ConsoleApp
from console.core.events import ActionResult, ConnState, Outcome, Record, TrainerFound, TrainerInfo
from console.core.place import HOST
from console.core.state import ConsoleState
from console.screens.launch_dialog import LaunchDialog
from console.screens.stop_dialog import StopDialog
from tests.support.records import T0, step
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)


def _found(pid: int = 4242) -> TrainerFound:
    return TrainerFound(
        TrainerInfo(pid, 99, ["python3", "-m", "trainer.pipeline"], "/runs/a", "run.json", {})
    )


class FakeSession:
    """What the dialogs call of a session: a stop that succeeds, a launch that succeeds."""

    readonly = False
    place = HOST

    def __init__(self) -> None:
        self.stops = 0
        self.launches: list[list[str]] = []
        self.on_stop = lambda: None  # what the session sees when the trainer has stopped

    def subscribe(self, callback):
        return lambda: None

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def stop_trainer(self, timeout=120.0, on_phase=None):
        self.stops += 1
        self.on_stop()
        return ActionResult(Outcome.OK, "stopped: checkpoint saved (step 7); pid 4242 exited, exit code 0")

    async def launch(self, flags, python="python3", code_dir=None, on_status=None, **kw):
        self.launches.append(flags)
        return ActionResult(
            Outcome.OK, "launched pid 14338 in /runs/a (code /opt/code)", trainer=_found(14338).trainer
        )


def _app(session=None) -> ConsoleApp:
    app = ConsoleApp(None, state=ConsoleState(clock=lambda: T0 + 60), target="127.0.0.1 · CT 200")
    app.session = session  # after __init__: on_mount starts nothing (no connection to make)
    return app


async def _stopped(app, pilot) -> StopDialog:
    app.feed([ConnState("connected"), _found(), Record(step(T0, 7))])
    await pilot.press("s")
    dlg = app.screen
    assert isinstance(dlg, StopDialog)
    await pilot.press("y")
    await until(pilot, lambda: dlg.done, 10, "the stop to finish")
    return dlg


async def test_q_quits_from_a_finished_stop_dialog():
    app = _app(FakeSession())
    quits = []
    async with app.run_test(size=SIZE) as pilot:
        await _stopped(app, pilot)
        app.exit = lambda *a, **kw: quits.append(1)  # (the real one would end run_test here)
        await pilot.press("q")
        await until(pilot, lambda: quits, 5, "q to quit")
        assert not isinstance(app.screen, StopDialog)


async def test_s_on_a_finished_stop_dialog_asks_again():
    session = FakeSession()
    app = _app(session)
    async with app.run_test(size=SIZE) as pilot:
        first = await _stopped(app, pilot)
        await pilot.press("s")  # "press s again to wait longer" is what a timed-out dialog says
        await until(
            pilot, lambda: isinstance(app.screen, StopDialog) and app.screen is not first, 5, "a new dialog"
        )
        assert not app.screen.done and app.screen.started_at is None  # it asks first again
        await pilot.press("escape")
        assert not isinstance(app.screen, StopDialog) and session.stops == 1


async def test_keys_of_a_stop_in_progress_stay_with_the_dialog():
    app = _app(FakeSession())
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _found(), Record(step(T0, 7))])
        await pilot.press("s")
        dlg = app.screen
        dlg.started_at = dlg.clock()  # as if confirmed and waiting on the trainer
        await pilot.press("q", "escape")
        assert app.screen is dlg  # nothing leaves a stop half-watched


async def test_a_launch_that_succeeds_closes_the_dialog_and_says_once_what_started():
    session = FakeSession()
    app = _app(session)
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected")])
        await pilot.press("l")
        assert isinstance(app.screen, LaunchDialog)
        app.screen.query_one("#flags").value = "--target-model /m --output-dir /runs/a"
        app.screen.query_one("#code_dir").value = "/opt/code"
        await pilot.click("#launch")
        await until(pilot, lambda: not isinstance(app.screen, LaunchDialog), 5, "the dialog to close")
        assert session.launches == [["--target-model", "/m", "--output-dir", "/runs/a"]]
        said = [e.text for e in app.state.events]
        assert said == ["launched pid 14338 in /runs/a (code /opt/code)"], (
            said
        )  # not "launched, PID 14338: launched pid 14338"
        await until(
            pilot, lambda: "launched pid 14338 in /runs/a" in screen_text(app), 10, "the launch shown"
        )


async def test_a_stop_dialog_says_what_happened_and_its_ages_move():
    now = [T0 + 60]
    session = FakeSession()
    app = ConsoleApp(None, state=ConsoleState(clock=lambda: now[0]), target="127.0.0.1 · CT 200")
    app.session = session
    saved = {"t": T0 + 55, "kind": "event", "name": "checkpoint_saved", "step": 5}
    session.on_stop = lambda: app.feed([TrainerFound(None)])  # what the real session sees: it exited
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _found(), Record(step(T0, 7)), Record(saved)])
        await pilot.press("s")
        dlg = app.screen
        await until(pilot, lambda: "last checkpoint 5s ago" in screen_text(app), 5, "the checkpoint's age")
        now[0] += 30  # the dialog stays open: its figures are the state's now, not when it opened
        app.feed([Record(step(now[0], 9))])
        await until(pilot, lambda: "last checkpoint 35s ago" in screen_text(app), 5, "the age to move on")
        assert "step 9 / 100" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: dlg.done, 10, "the stop to finish")
        await until(pilot, lambda: "Trainer stopped" in screen_text(app), 5, "the title to say so")
        text = screen_text(app)
        assert "Stopping the trainer" not in text and "✔ stopped" in text
        assert "PID 4242 (exited)" in text and "no trainer found" not in text


async def test_the_launch_dialog_shows_every_flag_and_enter_launches():
    flags = [f"--flag-number-{i}" if i % 2 == 0 else f"value-{i}" for i in range(40)] + ["--last-flag", "9"]
    run = {"argv": flags, "interpreter": "python3", "code_dir": "/opt/code"}
    session = FakeSession()
    app = _app(session)
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected")])
        session.run = run  # run.json as the session last read it
        await pilot.press("l")
        assert isinstance(app.screen, LaunchDialog)
        await pilot.pause(0.1)
        shown = " ".join(screen_text(app).split())
        for flag in (flags[0], "--flag-number-20", "--last-flag 9"):  # the head, the middle, the tail
            assert flag in shown, shown
        await pilot.press("enter")  # right after l: it launches (a focused Cancel took it silently)
        await until(pilot, lambda: session.launches, 5, "the launch")
        assert session.launches == [flags]


async def test_a_toast_breaks_a_long_path_at_its_slashes_not_mid_name():
    where = "/workspace/experiments/dflash-ablations/.dflash-console/code/51e28c0a9d3b4f17a2c6e8d0b9f4a3c1"
    session = FakeSession()

    async def deploy():
        return where

    session.deploy = deploy
    app = _app(session)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.feed([ConnState("connected")])
        await pilot.press("d")
        await until(pilot, lambda: "uses it" in screen_text(app), 5, "the deploy's toast")
        text = screen_text(app)
        for name in where.strip("/").split("/"):  # each part of the path whole on one line
            assert name in text, (name, text)
