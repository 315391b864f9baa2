"""``--labels`` / ``--divergence`` (docs/trainer.md "Labels and divergences"): resolved once, old runs'
``--use-soft-labels`` kept, trained as asked, recorded in the checkpoint, and a resume under others refused."""

from __future__ import annotations

import pytest

from tests.support.trainer_run import run_in_process, steps, tiny_flags
from trainer.run.flags import FlagError, build_parser, loss_objective
from trainer.run.settings import resolve
from trainer.runtime.build import check_labels


def _resolve(tiny, tmp_path, *extra):
    return resolve(build_parser().parse_args(tiny_flags(tiny, tmp_path / "out", *extra)))


@pytest.mark.parametrize(
    ("extra", "labels", "divergence", "objective"),
    [
        ((), "data", None, "data"),
        (("--use-soft-labels",), "target-dist", "kl", "kl"),  # old runs' flag: the same as before
        (("--labels", "target-dist"), "target-dist", "kl", "kl"),
        (("--use-soft-labels", "--labels", "target-dist", "--divergence", "tv"), "target-dist", "tv", "tv"),
        (
            ("--labels", "target-dist", "--divergence", "reverse-kl"),
            "target-dist",
            "reverse-kl",
            "reverse-kl",
        ),
        (("--labels", "target-argmax"), "target-argmax", None, "target-argmax"),
    ],
)
def test_labels_resolve_once_and_name_the_losss_objective(
    tiny_assets, tmp_path, extra, labels, divergence, objective
):
    s = _resolve(tiny_assets, tmp_path, *extra)
    assert (s.labels, s.divergence, loss_objective(s)) == (labels, divergence, objective)
    assert s.use_soft_labels == (labels != "data")  # the target's final hidden state is captured


@pytest.mark.parametrize(
    ("extra", "flag", "text"),
    [
        (("--use-soft-labels", "--labels", "data"), "--use-soft-labels", "contradicts --labels data"),
        (("--divergence", "jsd"), "--divergence", "applies to --labels target-dist only"),
        (("--labels", "target-argmax", "--divergence", "kl"), "--divergence", "not --labels target-argmax"),
    ],
)
def test_contradicting_label_flags_are_refused_naming_the_flag(tiny_assets, tmp_path, extra, flag, text):
    with pytest.raises(FlagError) as e:
        _resolve(tiny_assets, tmp_path, *extra)
    assert e.value.flag == flag and text in e.value.message


def test_a_checkpoint_older_than_labels_resumes_as_what_it_was(tiny_assets, tmp_path):
    soft = _resolve(tiny_assets, tmp_path, "--use-soft-labels")
    check_labels(soft, {"use_soft_labels": True}, "ck")  # its soft labels were KL's gradient: the same run
    check_labels(_resolve(tiny_assets, tmp_path), {"use_soft_labels": False}, "ck")
    with pytest.raises(
        FlagError, match="trained with --labels target-dist --divergence kl, not --labels data"
    ):
        check_labels(_resolve(tiny_assets, tmp_path), {"use_soft_labels": True}, "ck")


def test_a_run_trains_with_its_divergence_and_refuses_to_resume_under_another(tiny_assets, tmp_path, capfd):
    out = tmp_path / "run"
    argv = ("--labels", "target-dist", "--divergence", "jsd", "--seed", "3")
    assert run_in_process(tiny_flags(tiny_assets, out, "--max-steps", "2", *argv)) == 0
    first = steps(out)
    assert [s["step"] for s in first] == [1, 2]
    assert all(0 < s["loss"] <= 0.6932 for s in first)  # a JSD: within (0, log 2]
    capfd.readouterr()
    for other, said in (
        (("--labels", "target-dist", "--divergence", "tv"), "--divergence: checkpoint"),
        (("--use-soft-labels",), "--divergence: checkpoint"),
        (("--labels", "target-argmax"), "--labels: checkpoint"),
        ((), "--labels: checkpoint"),
    ):
        assert run_in_process(tiny_flags(tiny_assets, out, "--max-steps", "3", *other, "--seed", "3")) == 2
        err = capfd.readouterr().err
        assert said in err and "trained with --labels target-dist --divergence jsd" in err, err
    assert [s["step"] for s in steps(out)] == [1, 2]  # nothing trained under the wrong objective
    assert run_in_process(tiny_flags(tiny_assets, out, "--max-steps", "3", *argv)) == 0
    assert [s["step"] for s in steps(out)] == [1, 2, 3]
