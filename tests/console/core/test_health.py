"""The health rules (console/core/health.py), each driven from synthetic session events with a frozen
clock: start, escalate, clear, acknowledge; and the recorded healthy run raises nothing from start to end."""

from __future__ import annotations

import math

import pytest

from console.core.config_file import ConfigError, config_path, health_config
from console.core.events import ActionPhase, CheckpointEntry, DiskInfo, Gpu, GpuSample, Record, TrainerFound
from console.core.events import TrainerInfo as TI
from console.core.health import CRITICAL, NOTE, OK, WARNING, Health, HealthConfig, save_interval
from tests.support.replay import recorded


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def trainer(pid=42, argv=(), code_dir="/work/code") -> TI:
    run = {"pid": pid, "argv": list(argv), "code_dir": code_dir}
    return TI(pid, 1, ["python", "-m", "trainer.pipeline", *argv], "/run", "run.json", run)


def ev(name, t, **kw):
    return Record({"kind": "event", "name": name, "t": t, **kw})


def tp(t, tok=1000.0):
    return Record(
        {
            "kind": "throughput",
            "t": t,
            "devices": [
                {"device": "cuda:0", "role": "target", "tok_s": 5 * tok},
                {"device": "cuda:1", "role": "drafter", "tok_s": tok},
            ],
            "queue": {"depth": 0, "capacity": 8},  # an empty queue is no alert
        }
    )


def step(t, n, loss=1.0):
    return Record({"kind": "step", "t": t, "step": n, "loss": loss})


def running(clock: Clock, cfg: HealthConfig | None = None, argv=(), **kw) -> Health:
    h = Health(cfg, clock=clock, **kw)
    h.apply_all([TrainerFound(trainer(argv=argv)), ev("started", clock.t, step=0, pid=42), tp(clock.t)])
    return h


def keys(h: Health) -> dict[str, str]:
    return {a.key: a.level for a in h.alerts()}


def test_trainer_exit_without_stop_is_critical_at_once_and_clears_on_a_new_start():
    """At once: the session delivers the trainer's last records before its exit (test_exit_order.py)."""
    c = Clock()
    h = running(c)
    assert h.evaluate() == [] and h.level() == OK
    c.t += 1
    h.apply(TrainerFound(None))
    c.t += 0.01
    (ch,) = h.evaluate()
    assert (ch.kind, ch.alert.key, ch.alert.level) == ("started", "trainer_exit", CRITICAL)
    assert ch.alert.since == 1001.0  # since the exit, not since it was noticed
    assert "without a stop request" in ch.alert.message
    # acknowledged: silent, still listed, evaluating again changes nothing
    assert h.acknowledge("trainer_exit") and not h.acknowledge("trainer_exit")
    assert h.level(include_acked=False) == OK and h.level() == CRITICAL
    c.t += 10
    assert h.evaluate() == [] and h.alerts()[0].acked
    # a new trainer: cleared, kept in the past
    h.apply_all([TrainerFound(trainer(pid=43)), ev("started", c.t, step=5, pid=43)])
    (ch,) = h.evaluate()
    assert ch.kind == "cleared" and ch.alert.cleared == c.t and list(h.past) == [ch.alert]
    assert h.alerts() == []


@pytest.mark.parametrize(
    "ending",
    [
        [ev("stopped", 0, reason="finished", exit_code=0)],  # folded after the exit, before an evaluation
        [ev("stop_requested", 0, signal="SIGINT")],
        [],  # a stop by this console: the phases came before the exit
    ],
)
def test_a_requested_or_finished_exit_raises_nothing(ending):
    c = Clock()
    h = running(c)
    if not ending:
        h.apply(ActionPhase("signal_sent", "SIGINT sent", None, c.t))
    h.apply(TrainerFound(None))
    c.t += 0.1
    h.apply_all(ending)
    c.t += 5
    assert h.evaluate() == []


def test_a_stopped_error_record_is_critical_at_once():
    c = Clock()
    h = running(c)
    h.apply_all([ev("error", c.t, message="boom"), ev("stopped", c.t, reason="error", exit_code=1)])
    h.apply(TrainerFound(None))
    (ch,) = h.evaluate()
    assert ch.alert.level == CRITICAL and "error (exit 1)" in ch.alert.message


def test_a_relaunch_is_not_an_exit_while_its_process_is_being_found():
    """The old trainer gone (seen exiting, stopped cleanly), a new one launched: its `started` record can arrive
    before the session has found its process. That is no exit; it is one if the process never shows up."""
    c = Clock()
    h = running(c)
    h.apply(ev("stopped", c.t, reason="signal", exit_code=0))
    c.t += 1
    h.apply(TrainerFound(None))
    assert h.evaluate() == []
    c.t += 30
    h.apply(ev("started", c.t, step=40, pid=43))  # the relaunch's first record
    c.t += 0.1
    assert h.evaluate() == []  # (before: trainer_exit, critical, for the tick until the process was found)
    h.apply(TrainerFound(trainer(pid=43)))
    assert h.evaluate() == []
    h2 = running(Clock())  # the same, but the new process never appears: an exit after start_find_s
    h2.clock.t += 1
    h2.apply_all([ev("stopped", h2.clock.t, reason="signal", exit_code=0), TrainerFound(None)])
    h2.clock.t += 30
    h2.apply(ev("started", h2.clock.t, step=40, pid=43))
    assert h2.evaluate() == []
    h2.clock.t += h2.config.start_find_s
    assert [x.alert.key for x in h2.evaluate()] == ["trainer_exit"]


def test_a_one_shot_check_of_a_fresh_run_whose_trainer_died_is_critical_at_once():
    """`status --check` looks for the trainer first, then reads the history (each record at its own time): a
    run started 5 s ago whose process is gone is an exit, not a start being found."""
    c = Clock()
    h = Health(clock=c)
    h.apply(TrainerFound(None))
    for rec in (ev("started", c.t - 5, step=0, pid=42), tp(c.t - 3)):
        h.apply_record(rec.record, recv=rec.record["t"])
    assert [x.alert.key for x in h.evaluate()] == ["trainer_exit"]


def test_a_run_found_dead_at_start_is_critical():
    """The console connects after the trainer died: no trainer, and the history has no stop."""
    c = Clock()
    h = Health(clock=c)
    h.apply_all([TrainerFound(None), ev("started", c.t - 100, step=0), tp(c.t - 50)])
    assert keys(h) == {} and [x.alert.key for x in h.evaluate()] == ["trainer_exit"]


def test_nan_loss_is_critical_and_clears_on_a_finite_loss():
    c = Clock()
    h = running(c)
    h.apply(step(c.t, 1, float("nan")))
    (ch,) = h.evaluate()
    assert ch.alert.level == CRITICAL and "nan" in ch.alert.message
    h.apply(step(c.t, 2, 0.5))
    assert [x.kind for x in h.evaluate()] == ["cleared"]
    h.apply(step(c.t, 3, math.inf))
    assert "inf" in h.evaluate()[0].alert.message
    h.apply(step(c.t, 4, 0.5))
    assert h.evaluate()[0].kind == "cleared"
    h.apply(ev("nan_skipped", c.t, step=5))  # the trainer skipped a non-finite step
    (ch,) = h.evaluate()
    assert ch.kind == "started" and ch.alert.level == CRITICAL and "step 5 skipped" in ch.alert.message


def test_no_metrics_for_two_minutes_while_the_process_lives():
    c = Clock()
    h = running(c)
    c.t += 119.9
    assert h.evaluate() == []
    c.t += 0.1
    (ch,) = h.evaluate()
    assert ch.alert.key == "stale_metrics" and ch.alert.level == WARNING and ch.alert.since == 1120.0
    h.apply(tp(c.t))  # data again
    assert h.evaluate()[0].kind == "cleared"
    # a checkpoint save holds it off; a dead trainer is the exit rule's, not this one's
    h.apply(ev("checkpoint_saving", c.t, step=10))
    c.t += 500
    assert h.evaluate() == []


def test_a_slow_start_gets_the_startup_grace():
    c = Clock()
    h = Health(clock=c)
    h.apply_all([TrainerFound(trainer()), ev("started", c.t, step=0)])  # loading a big target: no records
    c.t += 599
    assert h.evaluate() == []
    c.t += 1
    assert keys(h) == {} and h.evaluate()[0].alert.key == "stale_metrics"


def feed_tok(h: Health, c: Clock, seconds: int, tok: float) -> list:
    changes = []
    for _ in range(seconds):
        c.t += 1
        h.apply(tp(c.t, tok))
        changes += h.evaluate()
    return changes


def test_tok_s_under_half_its_median_for_60_s():
    c = Clock()
    h = running(c)
    assert feed_tok(h, c, 400, 1000.0) == []
    # the smoothed (10 s mean) figure falls under 500 a few seconds in; 60 s after that: a warning
    changes = feed_tok(h, c, 66, 300.0)
    assert changes == []
    (ch,) = feed_tok(h, c, 10, 300.0)
    assert ch.alert.key == "tok_s_drop" and ch.alert.level == WARNING
    assert "median 1,000" in ch.alert.message
    (ch,) = feed_tok(h, c, 20, 1000.0)
    assert ch.kind == "cleared"


def test_tok_s_dips_for_saves_and_short_runs_are_quiet():
    c = Clock()
    h = running(c)
    assert feed_tok(h, c, 100, 1000.0) + feed_tok(h, c, 100, 100.0) == []  # no 5 min of history yet
    h = running(c)
    feed_tok(h, c, 400, 1000.0)
    h.apply(ev("checkpoint_saving", c.t, step=10, expected_s=90))
    assert feed_tok(h, c, 120, 0.0) == []  # a long save: tok/s is 0 by design
    h.apply(ev("checkpoint_saved", c.t, step=10, path="/run/checkpoints/step_00000010", bytes=10))
    assert feed_tok(h, c, 100, 1000.0) == []
    h.apply(ev("stop_requested", c.t))
    assert feed_tok(h, c, 100, 0.0) == []


def test_checkpoint_older_than_twice_the_save_interval_in_steps():
    c = Clock()
    h = running(c, argv=["--save-every", "10"])
    h.apply(step(c.t, 20))
    assert h.evaluate() == []
    h.apply(step(c.t, 21))
    (ch,) = h.evaluate()
    assert ch.alert.key == "checkpoint_age" and "no checkpoint yet, 21 steps ago" in ch.alert.message
    h.apply(ev("checkpoint_saved", c.t, step=20, path="p", bytes=100))
    assert h.evaluate()[0].kind == "cleared"
    # the disk scan knows a newer checkpoint than the (cut) history does
    h.apply(step(c.t, 45))
    assert h.evaluate()[0].alert.key == "checkpoint_age"
    h.apply(disk(free=10**12, latest_step=40))
    assert h.evaluate()[0].kind == "cleared"


def test_checkpoint_older_than_twice_the_save_interval_in_minutes():
    c = Clock()
    h = running(c, argv=["--save-every-minutes", "1"])
    h.apply(tp(c.t + 120))  # record time moves: two minutes since the start
    assert h.evaluate() == []
    h.apply(tp(c.t + 121))
    assert keys(h) == {} and h.evaluate()[0].alert.key == "checkpoint_age"
    assert save_interval({"argv": ["--save-every=5", "--save-every-minutes", "2.5"]}) == (5, 150.0)
    assert save_interval({"argv": ["--save-every", "0"]}) == (None, None)
    assert save_interval(None) == (None, None)


def disk(free: int, size: int = 100, latest_step: int = 10) -> DiskInfo:
    e = CheckpointEntry(f"step_{latest_step:08d}", "/run/c", latest_step, size, 1.0, True, latest=True)
    return DiskInfo("/run", free, 10**13, [e], e.name)


def test_disk_free_under_twice_a_checkpoint_escalates_and_an_ack_does_not_hide_worse():
    c = Clock()
    h = running(c)
    h.apply(disk(free=250))
    assert h.evaluate() == []
    h.apply(disk(free=150))
    (ch,) = h.evaluate()
    assert (ch.kind, ch.alert.level) == ("started", WARNING)
    assert h.acknowledge("disk_free") and h.level(include_acked=False) == OK
    c.t += 5
    h.apply(disk(free=50))  # a save would fail now
    (ch,) = h.evaluate()
    assert (ch.kind, ch.alert.level, ch.alert.acked) == ("escalated", CRITICAL, False)
    assert ch.alert.since == 1000.0 and ch.alert.level_since == 1005.0
    h.apply(disk(free=10**9))
    assert h.evaluate()[0].kind == "cleared"


def test_gpu_memory_and_temperature():
    c = Clock()
    h = running(c)
    ok = Gpu(0, "GPU-a", "H200", 99.0, 130_000.0, 143_771.0, 600.0, 80.0)  # 90%, 80 C
    hot = Gpu(1, "GPU-b", "H200", 99.0, 140_000.0, 143_771.0, 600.0, 87.0)  # 97.4%, at slowdown
    h.apply(GpuSample([ok, hot]))
    h.evaluate()
    assert keys(h) == {"gpu_mem:1": WARNING, "gpu_temp:1": WARNING}
    h.apply(GpuSample([ok]))
    assert sorted(x.kind for x in h.evaluate()) == ["cleared", "cleared"]


def test_real_acceptance_20_percent_below_its_best():
    c = Clock()
    h = running(c)
    for v in (3.0, 3.5, 2.81):
        h.apply(Record({"kind": "eval", "t": c.t, "step": 10, "accept_len": v}))
    h.apply(Record({"kind": "eval", "t": c.t, "step": 11}))  # another schema: skipped
    assert h.evaluate() == []
    h.apply(Record({"kind": "eval", "t": c.t, "step": 30, "accept_len": 2.7}))
    (ch,) = h.evaluate()
    assert ch.alert.key == "accept_drop" and "23% below its best 3.50" in ch.alert.message
    h.apply(Record({"kind": "eval", "t": c.t, "step": 40, "accept_len": 3.4}))
    assert h.evaluate()[0].kind == "cleared"


def test_code_differs_from_the_bundled_trainer_is_a_note():
    c = Clock()
    h = Health(clock=c, bundled_key="1111111111111111")
    h.apply(TrainerFound(trainer(code_dir="/root/.dflash-console/code/2222222222222222")))
    h.evaluate()
    (a,) = h.alerts()
    assert a.level == NOTE and "2222222222222222" in a.message and "1111111111111111" in a.message
    assert h.level() == NOTE
    h2 = Health(clock=c, bundled_key="2222222222222222")
    h2.apply(TrainerFound(trainer(code_dir="/root/.dflash-console/code/2222222222222222")))
    h3 = Health(clock=c, bundled_key="1111111111111111")
    h3.apply(TrainerFound(trainer(code_dir="/home/me/src/dflash")))  # the user's own checkout: no judgement
    assert h2.evaluate() == [] and h3.evaluate() == []


def test_the_recorded_healthy_run_raises_nothing_from_start_to_end():
    events, _ = recorded(until="no such event")  # everything: start, saves, SIGINT, stopped
    c = Clock(next(e.record["t"] for e in events if isinstance(e, Record)))
    h = Health(clock=c)
    for e in events:
        t = getattr(e, "record", {}).get("t") if isinstance(e, Record) else None
        if t:
            c.t = t
        h.apply(e)
        assert h.evaluate() == [], e
    h.apply(TrainerFound(None))  # the trainer is gone after its clean stop
    c.t += 60
    assert h.evaluate() == [] and list(h.past) == []
    assert h.f.stopped["reason"] == "signal"


def test_config_file_health_section(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    p = config_path()
    assert p == tmp_path / "dflash-console" / "config.toml"
    assert health_config() == HealthConfig()  # no file: the defaults
    p.parent.mkdir()
    p.write_text('[health]\ngpu_mem_pct = 95\nbell = false\n\n[targets.a]\nhost = "x"\n')
    cfg = health_config()
    assert cfg.gpu_mem_pct == 95.0 and cfg.bell is False and cfg.stale_metrics_s == 120.0
    p.write_text("[health]\ngpu_mem = 95\n")
    with pytest.raises(ConfigError, match="no setting 'gpu_mem'"):
        health_config()
    p.write_text('[health]\nbell = "yes"\n')
    with pytest.raises(ConfigError, match="true or false"):
        health_config()
    p.write_text("[health\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        health_config()
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_path() == tmp_path / "home" / ".config" / "dflash-console" / "config.toml"
