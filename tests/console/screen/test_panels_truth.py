"""The main screen says only what is true now: a run that is not running shows its last known figures
dimmed with their age and no rates (tok/s, queue, ETA); graph ticks are round values; the log's
count is of what it shows; a one-run replay does not offer an overview it lacks. At 130x40."""

from console.app import ConsoleApp
from console.core.events import ConnState, LogLines, Record, TrainerFound, TrainerInfo
from console.core.record import Entry, Recording
from console.core.state import ConsoleState
from console.tui.replay_app import ReplayApp
from tests.support.records import T0, dev, step, tp
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 5

    def __call__(self) -> float:
        return self.now


def _found(pid=4242) -> TrainerFound:
    return TrainerFound(
        TrainerInfo(pid, 99, ["python3", "-m", "trainer.pipeline"], "/runs/a", "run.json", {})
    )


def _running(t_end: float) -> list:
    """A run at 10.9K tok/s with a full queue, stepping once a second up to ``t_end``."""
    evs = [ConnState("connected"), _found()]
    for i, t in enumerate(range(int(T0 - 20), int(t_end) + 1)):
        evs.append(Record(step(t, 100 + i, total=5000, loss=1.5)))
        evs.append(Record(tp(t, [dev(0, "target", 11_000.0), dev(1, "drafter", 10_900.0)], depth=7, cap=8)))
    return evs


def _row(text: str, label: str) -> str:
    return next(line.split("│", 1)[1] for line in text.splitlines() if f"│ {label} " in line)


def _spans_at(widget, needle: str) -> set[str]:
    """The styles over the first occurrence of ``needle`` in a text widget's content."""
    content = widget._content
    start = content.plain.index(needle)
    return {str(s.style) for s in content.spans if s.start <= start < s.end}


async def test_figures_of_a_run_that_stopped_are_the_last_known_dimmed_and_without_rates():
    clock = Clock()
    app = ConsoleApp(None, state=ConsoleState(clock=clock), target="127.0.0.1 · CT 200", clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(_running(T0))
        await pilot.pause(0.2)
        live = screen_text(app)
        assert "10.9K tok/s" in _row(live, "throughput") and "7/8" in live and "ETA        -" not in live
        clock.now += 40
        app.feed([TrainerFound(None)])  # the trainer exited
        app.refresh_now(plots=True)
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "last known figures, 45s old" in _row(text, "throughput"), text
        assert "tok/s" not in _row(text, "throughput") and "10.9K" not in text and "11.0K" not in text
        assert "7/8" not in text and "target blocked" not in text  # no queue
        assert _row(text, "ETA").split() == ["ETA", "-"]
        assert "1.5000" in _row(text, "loss")  # the last known figures stay, ...
        assert "dim" in " ".join(_spans_at(app.w_training, "1.5000"))  # ... dimmed
        cells = app.w_gpus.cells()
        assert [c[7] for c in cells] == ["-", "-"], cells  # no per-device tok/s either
        app.feed([_found(5151)])  # a new trainer: figures are live again
        app.refresh_now()
        await pilot.pause(0.2)
        assert "last known" not in screen_text(app)


async def test_graph_ticks_are_round_values():
    clock = Clock()
    app = ConsoleApp(None, state=ConsoleState(clock=clock), target="127.0.0.1", clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        recs = [Record(step(T0 + i, 77 + i, total=500, loss=0.28 + i * 0.0105)) for i in range(150)]
        recs += [
            Record(tp(T0 + i, [dev(0, "target", 7177.2 + 35.7 * i), dev(1, "drafter", 6000.0 + 41.3 * i)]))
            for i in range(150)
        ]
        app.feed(recs)
        app.refresh_now(plots=True)
        await pilot.pause(0.2)
        for w in (app.w_loss, app.w_toks):
            r = w.region
            area = "\n".join(
                line[r.x : r.x + r.width] for line in screen_text(app).splitlines()[r.y : r.y + r.height]
            )
            labels = [
                tok for line in area.splitlines() for tok in line.replace("┤", " ").replace("┬", " ").split()
            ]
            numbers = [t for t in labels if t.rstrip("K").lstrip("-").replace(".", "", 1).isdigit()]
            assert numbers, area
            for n in numbers:  # 100, 150, 0.5, 10K: never 77.0, 226.8 or 12348.2
                v = float(n.rstrip("K"))
                assert "." not in n or len(n.split(".")[1]) <= 2, area
                assert v * 100 == round(v * 100) and (n.endswith("K") or "." in n or v % 5 == 0), area


async def test_log_count_is_of_the_lines_shown():
    app = ConsoleApp(None, state=ConsoleState(clock=lambda: T0), target="127.0.0.1")
    async with app.run_test(size=SIZE) as pilot:
        app.feed([LogLines([f"line {i}" for i in range(265)])])
        await until(pilot, lambda: "265 lines" in screen_text(app), 5, "the lines")
        app.log_view.clear()  # what a replay's jump back or another run on screen does
        await until(pilot, lambda: "following  0 lines" in screen_text(app), 5, "the count of an empty log")


def _recording(n_runs: int) -> Recording:
    """20 log lines a run, one a second from a second after the record's start (so its start has none)."""
    entries = [
        Entry(T0 + 1 + i, r, LogLines([f"run {r} line {i}"])) for i in range(20) for r in range(n_runs)
    ]
    runs = [{"label": f"run{r}", "where": f"h · CT {200 + r}"} for r in range(n_runs)]
    return Recording("mem.rec", {"t": T0, "runs": runs}, entries, [])


async def test_replay_at_home_counts_an_empty_log_and_offers_no_overview_for_one_run():
    app = ReplayApp(_recording(1), speed=1000.0)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "20 lines" in screen_text(app), 10, "the record played")
        footer = screen_text(app).splitlines()[-1]
        assert "Overview" not in footer, footer  # one run: nothing to go back to
        await pilot.press("space", "home")
        await until(pilot, lambda: "following  0 lines" in screen_text(app), 5, "the count at the start")
        await pilot.pause(0.3)  # and it stays so: no line of the record is shown at its start
        text = screen_text(app)
        assert "following  0 lines" in text and "run 0 line" not in text, text


async def test_replay_of_two_runs_still_offers_the_overview():
    app = ReplayApp(_recording(2), run=0, speed=1000.0)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "20 lines" in screen_text(app), 10, "the record played")
        await until(pilot, lambda: "Overview" in screen_text(app).splitlines()[-1], 10, "the overview's key")


async def test_every_position_of_a_block_of_8_is_written_out():
    """Block size 8 (the demo's): 7 positions, each value shown (``acc k=1..`` cut the seventh)."""
    acc = [0.97, 0.91, 0.84, 0.72, 0.63, 0.51, 0.42]
    app = ConsoleApp(None, state=ConsoleState(clock=Clock()), target="127.0.0.1 · CT 200")
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected"), _found(), Record({**step(T0, 7), "acc": acc})])
        await until(pilot, lambda: "loss" in _row(screen_text(app), "loss") and app.state.acc, 5, "the step")
        await until(pilot, lambda: ".97" in _row(screen_text(app), "acc k=1.."), 5, "the accuracies")
        row = _row(screen_text(app), "acc k=1..")
        assert ".97 .91 .84 .72 .63 .51 .42" in row and "…" not in row, row
        app.feed([Record({**step(T0 + 1, 8), "acc": acc * 2 + [0.3]})])  # block 16: 15 positions
        await until(pilot, lambda: "…" in _row(screen_text(app), "acc k=1.."), 5, "the longer row")
        row = _row(screen_text(app), "acc k=1..")
        assert row.rstrip().endswith("…") and ".97 .91" in row, row  # the first ones, then a mark


async def test_a_log_line_wider_than_the_pane_wraps_and_counts_as_one():
    long = "loading target " + " ".join(f"shard-{i:02d}-of-40.safetensors" for i in range(8)) + " done"
    app = ConsoleApp(None, state=ConsoleState(clock=lambda: T0), target="127.0.0.1")
    async with app.run_test(size=SIZE) as pilot:
        app.feed([LogLines(["first line", long, "last line"])])
        await until(pilot, lambda: "3 lines" in screen_text(app), 5, "the lines")
        assert len(long) > SIZE[0]
        text = " ".join(screen_text(app).split())
        assert long in text, text  # every word of it on screen, in order: nothing cut at the edge
        assert app.log_view.source_lines == ["first line", long, "last line"]
