"""``--report-to``: any subset of tensorboard, wandb, mlflow (none by default); a bad name is refused while the
flags are parsed (exit 2, naming the flag and the choices); the settings keep it through the workers' JSON."""

from __future__ import annotations

import pytest

from tests.support.trainer_run import tiny_flags
from trainer.run.flags import TRACKERS, build_parser
from trainer.run.settings import Settings, resolve


def _parse(tmp_path, *extra):
    return build_parser().parse_args(tiny_flags(tmp_path, tmp_path / "out", *extra))


def test_default_none_and_subsets_in_one_order(tmp_path):
    assert _parse(tmp_path).report_to == ()
    assert _parse(tmp_path, "--report-to", "mlflow,tensorboard").report_to == ("tensorboard", "mlflow")
    assert _parse(tmp_path, "--report-to", " WandB , wandb,").report_to == ("wandb",)
    assert _parse(tmp_path, "--report-to", "none").report_to == ()
    assert _parse(tmp_path, "--report-to", ",".join(TRACKERS)).report_to == TRACKERS


@pytest.mark.parametrize("value", ["tensorbord", "wandb,comet", "mlflow;wandb"])
def test_a_bad_name_is_refused_at_parsing(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        _parse(tmp_path, "--report-to", value)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--report-to" in err and "unknown tracker" in err and "tensorboard, wandb, mlflow" in err


def test_the_settings_keep_it_through_the_workers_json(tiny_assets, tmp_path):
    s = resolve(
        build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "o", "--report-to", "wandb,mlflow"))
    )
    assert s.report_to == ("wandb", "mlflow")
    assert Settings.from_json(s.to_json()) == s
