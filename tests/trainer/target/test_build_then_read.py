"""The target's load in two halves (``capture.begin_target`` on the calling thread, ``PendingTarget.finish``
in another): torch.compile saves and restores torch's process-wide default dtype around every frame it
compiles, and transformers sets it while it builds a model, so a build beside a compile came out partly
fp32 on an H200. Reading the weights must not depend on that state: here a thread flips the default dtype
all through ``finish``, and every tensor still comes out in the asked dtype, equal to the checkpoint."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file

from trainer.target.capture import begin_target, load_target


def _flip_default_dtype(stop: threading.Event) -> None:
    while not stop.is_set():
        torch.set_default_dtype(torch.float64)
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("assets", ["tiny_assets", "tiny_hybrid"])
def test_weights_read_beside_a_thread_that_flips_the_default_dtype(assets, request):
    path = str(request.getfixturevalue(assets) / "target")
    pending = begin_target(path, "cpu", torch.bfloat16, [1, 3], need_final_hidden=True)
    stop = threading.Event()
    flipper = threading.Thread(target=_flip_default_dtype, args=(stop,), daemon=True)
    flipper.start()
    try:
        model = pending.finish()
    finally:
        stop.set()
        flipper.join()
        torch.set_default_dtype(torch.float32)
    ref = load_target(path, "cpu", torch.bfloat16, [1, 3], need_final_hidden=True)
    want = dict(ref.named_parameters())
    stored = load_file(f"{path}/model.safetensors")
    for name, p in model.named_parameters():
        assert p.dtype == want[name].dtype, name
        torch.testing.assert_close(p, want[name], rtol=0, atol=0)
    assert any(n in stored for n, _ in model.named_parameters())  # read from the files, not left empty
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_a_hybrid_chooses_its_conv_kernel_where_it_is_built(tiny_hybrid, monkeypatch):
    """The conv kernel's choice compiles a check (``doc_conv.select``), and torch's FX-tracing flag is
    process-wide: in the weights' thread, beside the drafter's first-step compile, it was refused on an H200.
    So ``begin_target`` chooses it, on the calling thread; on CUDA ``finish`` (``prepare_hybrid``) asks again
    and finds the choice remembered (``tests/trainer/target/test_gpu_doc_conv.py`` runs that whole)."""
    from trainer.target import hybrid

    calls = []
    real = hybrid._conv_kernel
    monkeypatch.setattr(
        hybrid, "_conv_kernel", lambda *a: calls.append(threading.current_thread().name) or real(*a)
    )
    pending = begin_target(str(tiny_hybrid / "target"), "cpu", torch.bfloat16, [1, 3])
    assert calls == [threading.current_thread().name]
    done = []
    reader = threading.Thread(target=lambda: done.append(pending.finish()), name="load-target")
    reader.start()
    reader.join()
    assert done and calls == [threading.current_thread().name]  # on the CPU its layout asks nothing more
