"""The acceptance estimate's running mean in step records (trainer/runtime/step_metrics.py, loop.py): the walk's tokens / steps
and the uniform mean, over the last EST_WINDOW steps, as the step records carry them."""

import json
import signal

import pytest

import trainer.drafting.loss as loss_mod
import trainer.runtime.roles as roles_mod
from tests.support.trainer_run import tiny_flags
from trainer import pipeline
from trainer.runtime.step_metrics import running_estimate


def test_running_estimate_is_the_walks_ratio_and_the_uniform_mean():
    window = [(10.0, 8.0, 12.0, 6.0), (2.0, 8.0, 9.0, 3.0)]
    assert running_estimate(window) == (pytest.approx(21 / 9), pytest.approx(1 + 12 / 16))
    # a checkpoint written before the walk: its (chain, blocks) pairs count for the uniform mean only
    assert running_estimate([(4.0, 8.0), (10.0, 8.0, 12.0, 6.0)]) == (
        pytest.approx(2.0),
        pytest.approx(1 + 14 / 16),
    )
    assert running_estimate([(4.0, 8.0)]) == (None, pytest.approx(1.5))
    assert running_estimate([]) == (None, None)


@pytest.mark.parametrize(("anchor_run", "est_anchors"), [("1", "0"), ("4", "0"), ("1", "12")])
def test_step_records_carry_the_walk_and_the_uniform_mean_of_the_real_loop(
    tiny_assets, tmp_path, monkeypatch, anchor_run, est_anchors
):
    """The real trainer in this process, its walk made visible: each step's records must be the running sums
    of what ``decode_walk`` returned (shifted by +3 tokens a call, so that the walk and the uniform mean differ
    even where a tiny drafter accepts nothing) and of the training blocks' chains. With ``--est-anchors 12`` the
    walk is given the measuring blocks only: one run of 12 consecutive anchors per row."""
    calls, losses = [], []
    real = loss_mod.decode_walk
    M = int(est_anchors)

    def recording(anchors, chain, valid):
        a = anchors[valid]
        if M:  # the measuring run: 12 consecutive candidates (the tiny data's rows hold many more)
            assert anchors.shape == (1, M) and valid.all()
            assert (a[1:] - a[:-1] == 1).float().mean() >= 0.8  # a document boundary may cut it once
        elif (
            anchor_run == "4"
        ):  # --anchor-run 4 reaches the sampler: anchors come in runs of consecutive positions
            assert (a[1:] - a[:-1] == 1).float().mean() >= 0.5
        tok, steps = real(anchors, chain, valid)
        tok = tok + 3
        calls.append((int(tok), int(steps)))
        return tok, steps

    def loss_recording(*args, **kw):
        loss, m = real_loss(*args, **kw)
        losses.append((int(m["chain_sum"]), int(m["n_blocks"]), kw["n_train"], args[3].shape[1]))
        return loss, m

    real_loss = roles_mod.dflash_loss
    monkeypatch.setattr(loss_mod, "decode_walk", recording)
    monkeypatch.setattr(roles_mod, "dflash_loss", loss_recording)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = pipeline.main(
            tiny_flags(
                tiny_assets,
                tmp_path / "run",
                "--max-steps",
                "4",
                "--use-soft-labels",
                "--anchor-run",
                anchor_run,
                "--est-anchors",
                est_anchors,
            )
        )
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert rc == 0
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        steps = [r for r in map(json.loads, f) if r["kind"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and len(calls) == len(
        losses
    ) == 4  # one micro-batch a step
    for i, s in enumerate(steps):
        seen, seen_loss = calls[: i + 1], losses[: i + 1]
        assert s["accept_len_est"] == pytest.approx(sum(c[0] for c in seen) / sum(c[1] for c in seen))
        assert s["accept_len_est_step"] == pytest.approx(calls[i][0] / calls[i][1])
        assert s["accept_len_est_uniform"] == pytest.approx(
            1 + sum(c[0] for c in seen_loss) / sum(c[1] for c in seen_loss)
        )
        n_train, cols = losses[i][2], losses[i][3]
        assert s["blocks"] == losses[i][1] <= n_train == cols - M  # the training blocks alone
        assert s["accept_len_est_vs"] == "target"
        assert s["accept_len_est_anchors"] == ("runs" if M else "training")
