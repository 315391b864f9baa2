"""``trainer.evaluate``'s speed figures (issue 54, item 3): fixed threads, said in the report; both decoders
timed alike (alternating order, same seed); a speed-up above the acceptance length, which bounds it, always
comes with a warning line naming the cause (the tiny target, in process)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.model_util import saved_random_drafter
from trainer.evaluation.report import format_report, speedup_warning
from trainer.evaluation.run import main


@pytest.fixture(scope="module")
def drafter(tiny_assets, tmp_path_factory):
    return saved_random_drafter(tiny_assets / "target", tmp_path_factory.mktemp("drafter"))


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _argv(tiny_assets, drafter, *extra) -> list[str]:
    return ["--target-model", str(tiny_assets / "target"), "--drafter", str(drafter), "--prompts",
            str(tiny_assets / "data"), "--num-prompts", "4", "--max-new-tokens", "8", "--device", "cpu", *extra]  # fmt: skip


def test_threads_are_fixed_and_said_and_the_decoders_alternate(
    tiny_assets, drafter, capsys, monkeypatch, restore_threads
):
    from trainer.evaluation import spec_decode

    order, seen_threads = [], set()
    for name in ("target_generate", "speculative_generate"):
        real = getattr(spec_decode, name)

        def spy(*args, _real=real, _name=name, **kw):
            order.append(_name[0])  # "t" / "s"
            seen_threads.add(torch.get_num_threads())
            return _real(*args, **kw)

        monkeypatch.setattr(spec_decode, name, spy)
    assert main(_argv(tiny_assets, drafter, "--threads", "2", "--json")) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["threads"] == 2 and seen_threads == {2}  # every decode, warm-up included, at the given count
    assert "on cpu (cache, 2 thread(s))" in cap.err
    assert order == ["t", "s", "t", "s", "s", "t", "t", "s", "s", "t"]  # warm-up, then alternating per prompt
    assert (rep["speedup_warning"] is not None) == (rep["speedup"] > rep["mean_accept_len"])
    assert main(_argv(tiny_assets, drafter)) == 0
    assert "device cpu, 1 thread(s)" in capsys.readouterr().out  # the default: one thread


def test_a_speedup_above_the_acceptance_length_is_never_printed_without_its_warning():
    rep = {"drafter": "d", "block_size": 16, "target": "t", "prompts": 8, "max_new_tokens": 64,
           "temperature": 0.0, "device": "cpu", "threads": 8, "cpu_count": 2, "load_average": 6.5,
           "mean_accept_len": 1.0, "verify_steps": 512, "new_tokens": 512, "per_position": [0.0] * 15,
           "histogram": [512] + [0] * 15, "spec_tok_s": 24.6, "target_tok_s": 10.0, "speedup": 2.46, "seconds": 80.0}  # fmt: skip
    rep["speedup_warning"] = speedup_warning(rep)
    text = format_report(rep)
    assert "speedup 2.46x" in text
    warning = next(ln for ln in text.splitlines() if ln.startswith("warning: "))
    assert "above the acceptance length 1.00" in warning and "100.0 ms a token" in warning
    assert "40.7 ms" in warning and "8 thread(s) on 2 cores, load average 6.5" in warning
    honest = {**rep, "spec_tok_s": 7.2, "speedup": 0.72}
    honest["speedup_warning"] = speedup_warning(honest)
    assert honest["speedup_warning"] is None and "warning" not in format_report(honest)
