"""The screen without a host: fed events directly (the same path a Session's events take)."""

from console.app import ConsoleApp
from console.core.events import ConnState, GpuSample, LogLines, Record, TrainerFound, TrainerInfo
from console.core.state import ConsoleState
from console.screens.help import HelpScreen
from console.screens.stop_dialog import StopDialog
from tests.support.records import T0, gpus, step, tp
from tests.support.screen_text import screen_text, until

SIZE = (120, 36)


def _trainer():
    run = {
        "argv": ["--target-model", "/m", "--output-dir", "/runs/a b"],
        "interpreter": "/usr/bin/python3",
        "code_dir": "/opt/code v2",
    }
    return TrainerFound(
        TrainerInfo(
            4242,
            99,
            ["python3", "-m", "trainer.pipeline", "--output-dir", "/runs/a b"],
            "/runs/a b",
            "run.json",
            run,
        )
    )


def _app(**kw):
    return ConsoleApp(None, state=ConsoleState(clock=lambda: T0 + 60), target="127.0.0.1 · CT 200", **kw)


def _cells(app):
    return app.w_gpus.cells()


async def test_table_and_panel_fill_from_events():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed(
            [
                ConnState("connected"),
                _trainer(),
                gpus(2),
                Record(
                    tp(
                        T0,
                        [
                            {"device": "cuda:0", "uuid": "GPU-0", "role": "target", "tok_s": 900.0},
                            {"device": "cuda:1", "uuid": "GPU-1", "role": "drafter", "tok_s": 450.0},
                        ],
                        depth=5,
                        cap=8,
                    )
                ),
                Record(step(T0, 7, total=70, loss=1.25)),
            ]
        )
        await pilot.pause(0.3)
        cells = _cells(app)
        assert cells[0][2] == "target" and cells[0][7] == "900"
        assert cells[1][2] == "drafter" and cells[1][7] == "450" and cells[1][3] == "10%"
        text = screen_text(app)
        assert "450 tok/s (drafters' sum" in text  # the headline is the drafter, not 900 + 450
        assert "7 / 70" in text and "1.2500" in text
        assert "5/8" in text
        assert "CONNECTED" in text and "trainer PID 4242" in text
        # a new sample updates cells in place
        app.feed([GpuSample([g.__class__(**{**g.__dict__, "util": 77.0}) for g in gpus(2).gpus])])
        await pilot.pause(0.3)
        assert _cells(app)[1][3] == "77%"


async def test_log_coalesces_caps_and_searches():
    app = _app(log_max_lines=1000)
    async with app.run_test(size=SIZE) as pilot:
        log = app.log_view
        for i in range(50):  # 50 bursts of 200 lines inside one flush period
            app.feed([LogLines([f"line {i * 200 + j} loss {j}" for j in range(200)])])
        await until(pilot, lambda: log.line_count, 5, "the log's timed flush")
        assert log.received == 10_000
        assert log.line_count == 1000 and log.lines[-1] == "line 9999 loss 199"
        assert app.refreshes < 10  # lines never trigger a screen refresh of their own
        await pilot.press("slash")
        await pilot.press(*"line 99")
        await pilot.press("enter")
        await pilot.pause(0.1)
        # matches: line 99, 990..999, 9900..9999 are within the last 1000 lines only as 9xxx
        assert log.current_match_line is not None
        assert log.lines[log.current_match_line] == "line 9999 loss 199"
        assert not log.auto_scroll  # jumping pauses following
        await pilot.press("N")
        assert log.lines[log.current_match_line] == "line 9998 loss 198"
        await pilot.press("f")
        assert log.auto_scroll


async def test_stop_dialog_is_guarded():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _trainer(), Record(step(T0, 7))])
        await pilot.press("s")
        await pilot.pause(0.1)
        dlg = app.screen
        assert isinstance(dlg, StopDialog)
        assert app.focused.id == "no"  # the safe choice is preselected
        text = screen_text(app)
        assert "PID 4242" in text and "trainer.pipeline" in text and "step 7" in text
        await pilot.press("enter")  # Enter on the preselected "No" cancels
        assert not isinstance(app.screen, StopDialog)
        await pilot.press("r")
        await pilot.press("escape")
        assert not isinstance(app.screen, StopDialog)
        await pilot.press("s", "n")
        assert not isinstance(app.screen, StopDialog)


async def test_readonly_removes_every_changing_action():
    app = _app(readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _trainer()])
        await pilot.pause(0.1)
        keys = {b.binding.action for b in app.active_bindings.values() if b.enabled}
        assert not keys & {"stop", "restart", "launch", "deploy"}
        assert {"quit", "help", "search"} <= keys
        assert [c[0] for c in app.palette_commands()] == [
            "alerts",
            "checkpoints",
            "threads",  # read-only: it reads /proc, py-spy reads memory
            "search",
            "help",
            "quit",
        ]
        for key in "srld":
            await pilot.press(key)
        assert not isinstance(app.screen, StopDialog) and len(app.screen_stack) == 1
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = " ".join(r[1] for r in app.screen.rows)
        assert "Stop" not in shown and "Quit" in shown


async def test_palette_lists_the_actions():
    app = _app()
    async with app.run_test(size=SIZE):
        assert [c[0] for c in app.palette_commands()] == [
            "stop",
            "restart",
            "launch",
            "deploy",
            "alerts",
            "checkpoints",
            "threads",
            "search",
            "help",
            "quit",
        ]


async def test_the_palette_offers_one_quit_with_the_screens_own_words():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await pilot.press(*"quit")
        await until(pilot, lambda: "Quit the console" in screen_text(app), 10, "the palette's quit")
        text = screen_text(app)
        hits = [line.strip() for line in text.splitlines() if line.strip().startswith("Quit")]
        assert hits == ["Quit the console"] and "as soon as possible" not in text, text


def _region_text(app, widget) -> str:
    r = widget.region
    lines = screen_text(app).splitlines()[r.y : r.y + r.height]
    return "\n".join(line[r.x : r.x + r.width] for line in lines)


async def test_acceptance_graph_shows_the_estimate_and_the_measured_points():
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        app.feed([Record(step(T0 - 60 + i, i, total=400)) for i in range(1, 5)])  # an old run's records
        app.refresh_now(plots=True)
        await pilot.pause()
        empty = _region_text(app, app.w_accept)
        assert "acceptance length: none yet" in empty and "estimate" not in empty, empty
        assert app.w_accept.region.width >= 36 and app.w_loss.region.y == app.w_accept.region.y  # beside loss
        est = [Record({**step(T0 + i, i, total=400), "accept_len_est": 1.2 + i / 100}) for i in range(5, 121)]
        evals = [
            Record({"t": T0 + 200 + s, "kind": "eval", "step": s, "accept_len": v})
            for s, v in ((40, 1.9), (120, 3.5))
        ]
        app.feed(est + evals)
        app.refresh_now(plots=True)
        await pilot.pause()
        text = _region_text(app, app.w_accept)
        assert "acceptance length" in text and "none yet" not in text, text
        assert "estimate" in text and "eval" in text, text  # the two series, labelled
        assert text.count("●") == 2, text  # one marker per eval record
        # the y axis reaches the measured value (round ticks: 1..4); x is the step (50, 100)
        assert "4┤" in text and "1┤" in text and "100" in text, text


async def test_a_flood_past_the_cap_keeps_the_pane_on_the_newest_line():
    """Lines faster than the pane can show, past its cap (older ones pruned at every flush): while it
    says "following", the newest line is on screen once the flood ends; a scroll up pauses it."""
    app = _app(log_max_lines=2000)
    async with app.run_test(size=SIZE) as pilot:
        log = app.log_view
        n = 0
        while log.received < 40_000 or log.line_count < 2000:  # many flushes with pruning
            app.feed([LogLines([f"flood line {n + j}" for j in range(1000)])])
            n += 1000
            await pilot.pause(0.02)
        app.feed([LogLines(["END of the flood"])])
        await until(pilot, lambda: "END of the flood" in screen_text(app), 30, "the newest line shown")
        assert log.auto_scroll and "following" in screen_text(app)
        app.feed([LogLines([f"after {j}" for j in range(3)])])
        await until(pilot, lambda: "after 2" in screen_text(app), 30, "the next lines shown")

        log.focus()
        await pilot.press("pageup")  # the operator reads back: following pauses, and the status says so
        await until(pilot, lambda: not log.auto_scroll, 10, "following paused")
        await until(pilot, lambda: "paused (f follows)" in screen_text(app), 10, "the status")
        app.feed([LogLines(["newer while paused"])])
        await pilot.pause(0.3)
        assert "newer while paused" not in screen_text(app)  # the view stays where the operator is
        await pilot.press("f")
        await until(pilot, lambda: "newer while paused" in screen_text(app), 10, "followed again")
