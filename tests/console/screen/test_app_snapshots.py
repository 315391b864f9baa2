"""Snapshots (pytest-textual-snapshot) at 120x36 of the main screen, the stop dialog and help, fed
from a recorded tiny-trainer run with a frozen clock (tests/support/replay.py). Regenerate after a deliberate
change with ``pytest tests/console/screen/test_app_snapshots.py --snapshot-update`` and look at the SVGs."""

from console.app import ConsoleApp
from console.core.events import Record, TrainerFound
from console.core.state import ConsoleState
from tests.support.replay import recorded

SIZE = (120, 36)


def replay_app() -> ConsoleApp:
    """The app, with the recording fed through the same path a Session's events take."""
    events, last_t = recorded()

    def clock() -> float:
        return last_t + 5.0

    return ConsoleApp(
        None,
        state=ConsoleState(clock=clock),
        target="127.0.0.1 · CT 200 (recorded)",
        clock=clock,
        tick_s=3600,
    )


async def _settle(pilot) -> None:
    app = pilot.app
    await pilot.pause()  # laid out: the panels know their size
    app.feed(recorded()[0])
    app.log_view.flush()
    app.refresh_now(plots=True)
    await pilot.pause()


def test_main_screen(snap_compare):
    assert snap_compare(replay_app(), terminal_size=SIZE, run_before=_settle)


def test_stop_dialog(snap_compare):
    assert snap_compare(replay_app(), press=["s"], terminal_size=SIZE, run_before=_settle)


def test_help_screen(snap_compare):
    assert snap_compare(replay_app(), press=["question_mark"], terminal_size=SIZE, run_before=_settle)


def test_main_screen_with_an_active_alert(snap_compare):
    """The recorded trainer vanishes without a stop: a critical alert in the bar, the panel and a toast."""
    events, last_t = recorded()
    now = [last_t + 5.0]

    def clock() -> float:
        return now[0]

    app = ConsoleApp(
        None,
        state=ConsoleState(clock=clock),
        target="127.0.0.1 · CT 200 (recorded)",
        clock=clock,
        tick_s=3600,
    )

    async def run_before(pilot) -> None:
        await _settle(pilot)
        app.feed([TrainerFound(None)])
        now[0] += 12.0
        app.health_hooks.tick()
        app.refresh_now(plots=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_main_screen_during_a_start_up(snap_compare):
    """A restart of the recorded run, 14 s in, reading its target: the panel's start-up row (bar, bytes, rate,
    the estimate from the last start), from synthetic start-up records."""
    events, last_t = recorded()
    t0 = last_t + 60.0
    restart = [
        {"t": t0, "kind": "event", "name": "started", "pid": 4242, "step": 21, "expected_first_step_s": 38.5},
        {"t": t0 + 0.4, "kind": "startup", "phase": "compile_cache", "elapsed_s": 0.4, "state": "warm"},
        {"t": t0 + 5.0, "kind": "startup", "phase": "building_drafter", "elapsed_s": 5.0, "device": "cuda:1"},
        {
            "t": t0 + 6.0,
            "kind": "startup",
            "phase": "loading_target",
            "elapsed_s": 6.0,
            "bytes": 0,
            "total_bytes": 16 * 2**30,
            "device": "cuda:0",
        },
        {
            "t": t0 + 13.0,
            "kind": "startup",
            "phase": "loading_target",
            "elapsed_s": 13.0,
            "bytes": 7 * 2**30,
            "total_bytes": 16 * 2**30,
            "device": "cuda:0",
        },
    ]

    def clock() -> float:
        return t0 + 14.0

    app = ConsoleApp(
        None,
        state=ConsoleState(clock=clock),
        target="127.0.0.1 · CT 200 (recorded)",
        clock=clock,
        tick_s=3600,
    )

    async def run_before(pilot) -> None:
        await _settle(pilot)
        app.feed([Record(r) for r in restart])
        app.refresh_now(plots=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
