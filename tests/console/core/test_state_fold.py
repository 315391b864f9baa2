"""The screen's view model (console/core/state.py) folds metrics records into what is shown."""

from console.core.formatting import fmt_duration, fmt_tok_s
from console.core.state import ConsoleState
from tests.support.records import T0, dev, gpus, step, tp


def test_headline_is_drafters_sum_and_history_keeps_roles():
    st = ConsoleState(clock=lambda: T0)
    st.apply_record(tp(T0, [dev(0, "target", 900.0), dev(1, "drafter", 300.0), dev(2, "drafter", 200.0)]))
    assert st.tok_s == 500.0
    assert st.role_tok_s == {"target": 900.0, "drafter": 500.0}
    assert st.queue_depth == 3 and st.queue_capacity == 8
    assert st.tok_hist[-1] == (T0, 500.0, {"target": 900.0, "drafter": 500.0})


def test_step_eta_uses_record_time_not_the_clock():
    now = [T0]
    st = ConsoleState(clock=lambda: now[0])
    for i in range(11):
        st.apply_record(step(T0 + 2 * i, i))  # one step every 2 s
    assert st.step == 10 and st.total_steps == 100
    assert st.acc == [0.9, 0.5, 0.25] and st.lr == 3e-4
    assert st.steps_per_s() == 0.5
    assert st.eta_s() == 180.0
    now[0] += 1000  # the clock moving does not change the ETA
    assert st.eta_s() == 180.0
    assert list(st.loss_hist)[-1] == (10, 2.0)
    st.apply_record(step(T0 + 30, 3))  # resumed from an older checkpoint: the rate starts over
    assert st.eta_s() is None


def test_checkpoint_age_and_saving_follow_the_clock():
    now = [T0 + 100]
    st = ConsoleState(clock=lambda: now[0])
    assert st.checkpoint_age_s() is None
    st.apply_record(
        {"t": T0 + 90, "kind": "event", "name": "checkpoint_saving", "step": 5, "expected_s": 4.0}
    )
    assert st.saving_elapsed_s() == 10.0 and st.saving_expected_s == 4.0
    st.apply_record(
        {
            "t": T0 + 94,
            "kind": "event",
            "name": "checkpoint_saved",
            "step": 5,
            "path": "/r/checkpoints/step_00000005",
            "seconds": 3.9,
            "bytes": 2048,
        }
    )
    assert st.saving_since is None
    assert st.checkpoint_age_s() == 6.0 and st.ckpt_step == 5
    now[0] += 60
    assert st.checkpoint_age_s() == 66.0
    assert "checkpoint saved: step 5 in 3.9 s, 2.0 KB" in [e.text for e in st.events]


def test_unknown_kinds_fields_and_bad_values_are_survived():
    st = ConsoleState(clock=lambda: T0)
    v0 = st.version
    st.apply_record({"t": T0, "kind": "future", "x": 1})
    assert st.version == v0
    st.apply_record(
        {
            "t": None,
            "kind": "step",
            "step": "seven",
            "loss": "NaN?",
            "acc": [0.5, None, "x"],
            "new_field": {"a": 1},
        }
    )
    assert st.step is None and st.loss is None and st.acc == [0.5]
    st.apply_record(
        {
            "t": T0,
            "kind": "throughput",
            "devices": [None, {"role": "drafter", "tok_s": "fast"}],
            "queue": "full",
        }
    )
    assert st.tok_s == 0.0 and st.queue_depth is None
    st.apply_record({"t": T0, "kind": "event", "name": "stopped", "reason": "nan", "exit_code": 1})
    assert st.events[-1].level == "error"


def test_unmatched_trainer_devices_get_rows_of_their_own():
    st = ConsoleState(clock=lambda: T0)
    st.apply_record(
        tp(
            T0,
            [
                {"device": "cpu", "uuid": None, "role": "target", "tok_s": 50.0},
                {"device": "cpu", "uuid": None, "role": "drafter", "tok_s": 40.0},
            ],
        )
    )
    rows = st.rows()
    assert [(r.label, r.role, r.tok_s, r.util) for r in rows] == [
        ("cpu", "target", 50.0, None),
        ("cpu", "drafter", 40.0, None),
    ]


def test_formatting():
    assert fmt_duration(None) == "-"
    assert [fmt_duration(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m05s", "1h01m", "1d01h"]
    assert fmt_tok_s(14523.0) == "14.5K" and fmt_tok_s(812.4) == "812"


def test_gpus_join_trainer_devices_by_uuid():
    st = ConsoleState(clock=lambda: T0)
    st.apply(gpus(4))
    # the trainer names its devices by local index; the uuid ties them to the physical GPU
    st.apply_record(
        tp(
            T0,
            [
                {"device": "cuda:0", "uuid": "GPU-2", "role": "target", "tok_s": 900.0},
                {"device": "cuda:1", "uuid": "GPU-3", "role": "drafter", "tok_s": 450.0},
            ],
        )
    )
    rows = st.rows()
    assert [(r.label, r.role, r.tok_s, r.util) for r in rows] == [
        ("0", None, None, 0.0),
        ("1", None, None, 10.0),
        ("2", "target", 900.0, 20.0),
        ("3", "drafter", 450.0, 30.0),
    ]
    assert rows[3].device == "cuda:1" and rows[3].mem_used == 3072.0


def test_gpus_join_through_cuda_visible_devices_without_uuids():
    from console.core.events import TrainerFound, TrainerInfo

    st = ConsoleState(clock=lambda: T0)
    run = {"env": {"CUDA_VISIBLE_DEVICES": "3,1"}, "argv": ["--lr", "1e-3"]}
    st.apply(TrainerFound(TrainerInfo(42, 1, ["python3"], "/r", "run.json", run)))
    st.apply(gpus(4))
    st.apply_record(tp(T0, [dev(0, "target", 900.0, uuid=False), dev(1, "drafter", 450.0, uuid=False)]))
    roles = {r.label: r.role for r in st.rows()}
    assert roles == {"0": None, "1": "drafter", "2": None, "3": "target"}
    st.apply(TrainerFound(None))  # the trainer exited: its run.json stays for the launch dialog
    assert st.trainer is None and st.trainer_exited and st.run == run


def test_connection_states_and_retry_countdown():
    from console.core.events import ConnState

    now = [T0]
    st = ConsoleState(clock=lambda: now[0])
    st.apply(ConnState("disconnected", "not started"))
    st.apply(ConnState("connecting", "connecting to h"))
    st.apply(ConnState("connected"))
    now[0] += 5
    st.apply(ConnState("reconnecting", "connection lost", retry_in=2.0))
    assert st.conn.state == "reconnecting" and st.retry_left_s() == 2.0
    now[0] += 1.5
    assert st.retry_left_s() == 0.5 and st.conn_age_s() == 1.5
    st.apply(ConnState("connected"))
    assert st.retry_left_s() is None
    assert [e.text for e in st.events] == ["connection lost: connection lost", "connection restored"]


def test_tok_s_is_a_window_mean_per_device():
    st = ConsoleState(clock=lambda: T0, avg_window_s=2.0)
    # a trainer whose windows are shorter than a step: bursts and zeros
    for i, v in enumerate([0.0, 600.0, 0.0, 600.0, 0.0, 0.0]):
        st.apply_record(tp(T0 + 0.5 * i, [dev(0, "target", 1000.0), dev(1, "drafter", v)]))
    # the last 2 s of records hold 600, 0, 600, 0, 0 (t = 0.5 .. 2.5): mean 240
    assert st.tok_s == 240.0
    assert st.role_tok_s == {"target": 1000.0, "drafter": 240.0}
    assert [h[1] for h in st.tok_hist][:2] == [0.0, 300.0]


def test_acceptance_shows_the_newest_eval_else_the_estimate_marked():
    from console.core.status import acceptance
    from console.widgets.training_panel import accept_text

    st = ConsoleState(clock=lambda: T0)
    old = step(T0, 1)  # an old run: only the product formula
    st.apply_record(old)
    assert st.acceptance() == (old["accept_len"], "old")
    st.apply_record({**step(T0 + 1, 2), "accept_len_est": 2.75})
    assert st.acceptance() == (2.75, "estimate")
    assert accept_text(st).plain == "2.75 (estimate)"
    ev = {"t": T0 + 2, "kind": "eval", "step": 2, "accept_len": 3.125, "per_position": [0.9, 0.7]}
    st.apply_record(ev)
    st.apply_record({**step(T0 + 3, 3), "accept_len_est": 2.9})
    assert st.acceptance() == (3.125, "eval")  # a newer estimate does not hide the measured value
    assert accept_text(st).plain == "3.12 measured at step 2, est. now 2.90"
    assert "eval: acceptance length 3.12 at step 2" in [e.text for e in st.events]
    # status (text and --json) follow the same rule
    assert acceptance(ev, {"accept_len_est": 2.9, "step": 3}) == {"value": 3.125, "source": "eval", "step": 2}
    assert acceptance(None, {"accept_len_est": 2.9, "accept_len": 0.5, "step": 3})["source"] == "estimate"
    assert acceptance(None, {"accept_len": 0.5, "step": 3}) == {"value": 0.5, "source": "old", "step": 3}
    assert acceptance(None, None) is None
    # an eval record with its spread over prompts: the screen and status show it beside the value
    st.apply_record({"t": T0 + 4, "kind": "eval", "step": 4, "accept_len": 3.5, "accept_len_se": 0.25})
    assert accept_text(st).plain == "3.50 +- 0.25 measured at step 4, est. now 2.90"
    from console.core.status import accept_part

    ev_se = {**ev, "accept_len_se": 0.25}
    assert acceptance(ev_se, None) == {"value": 3.125, "source": "eval", "step": 2, "se": 0.25}
    assert accept_part(acceptance(ev_se, None)) == "accept_len 3.12 +- 0.25 (measured, step 2)"
    assert accept_part(acceptance(ev, None)) == "accept_len 3.12 (measured, step 2)"


def test_acceptance_histories_fold_estimates_and_evals_bounded():
    st = ConsoleState(clock=lambda: T0, history=4)
    st.apply_record(step(T0, 1))  # an old run's record: no estimate, no point
    assert list(st.accept_est_hist) == [] and list(st.eval_hist) == []
    for i in range(2, 8):
        st.apply_record({**step(T0 + i, i), "accept_len_est": 1.0 + i / 10})
    st.apply_record({**step(T0 + 8, 8), "accept_len_est": None})  # no blocks this step: nothing plotted
    assert list(st.accept_est_hist) == [(4, 1.4), (5, 1.5), (6, 1.6), (7, 1.7)]  # bounded like loss_hist
    st.apply_record({"t": T0 + 9, "kind": "eval", "step": 5, "accept_len": 2.5})  # evals land late
    st.apply_record({"t": T0 + 9, "kind": "eval", "step": 5, "accept_len": None})  # no value: ignored
    st.apply_record({"t": T0 + 10, "kind": "eval", "step": 8, "accept_len": 2.75})
    assert list(st.eval_hist) == [(5, 2.5), (8, 2.75)]
    assert list(st.accept_est_hist)[-1] == (7, 1.7)  # the eval records do not touch the estimate series
