"""The CUDA capture of a hybrid target (the fast path: flash-linear-attention's varlen Gated DeltaNet, bf16) vs the
CPU path (plain PyTorch, fp32) on packed rows: equal within bf16 noise, per document.

Run on a GPU machine with fla installed: ``PYTHONPATH=. python -m pytest tests/trainer/target/test_gpu_hybrid.py
-q -s`` (``DFLASH_GPU_OUT=DIR`` also writes the per-document errors to DIR/hybrid_gpu.json). Skipped
without CUDA or without fla."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from trainer.data.tiny_build import build_target, build_tokenizer
from trainer.target.capture import capture, capture_of, load_target
from trainer.target.hybrid import prepare_hybrid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention"),
]

# several 64-token chunks, 1 token, shorter and longer than the conv width; two rows, one right-padded
ROWS = [(200, 3, 1, 70, 130), (1, 64, 65, 2, 250, 20)]
LAYERS = [0, 3, 5, 7]
RESULTS: dict = {}


def _batch(seed: int = 0):
    T = max(sum(r) for r in ROWS)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 120, (len(ROWS), T), generator=g)
    doc = torch.full((len(ROWS), T), -1)
    for b, lens in enumerate(ROWS):
        s = 0
        for i, n in enumerate(lens):
            doc[b, s : s + n] = i
            s += n
    return ids, doc


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def target(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    build_target(str(out), request.param)
    build_tokenizer().save_pretrained(str(out))
    return request.param, str(out)


def test_cuda_fla_capture_equals_cpu_capture_per_document(target):
    kind, path = target
    cpu = load_target(path, "cpu", torch.float32, LAYERS, need_final_hidden=True)
    gpu = load_target(path, "cuda", torch.bfloat16, LAYERS, need_final_hidden=True)
    assert capture_of(gpu).linear == "fla", capture_of(gpu)
    ids, doc = _batch()
    want, want_final = capture(cpu, ids, doc, LAYERS, need_final_hidden=True)
    got, got_final = capture(gpu, ids.cuda(), doc, LAYERS, need_final_hidden=True)
    # the CUDA fp32 model through the plain-PyTorch path: the same numbers as the CPU (no bf16 involved)
    gpu32 = load_target(path, "cuda", torch.float32, LAYERS, need_final_hidden=True)
    prepare_hybrid(gpu32, attn="sdpa", linear="torch")
    got32, _ = capture(gpu32, ids.cuda(), doc, LAYERS, need_final_hidden=True)
    errs = []
    for b, lens in enumerate(ROWS):
        s = 0
        for n in lens:
            sl = (slice(b, b + 1), slice(s, s + n))
            e = {
                "row": b,
                "len": n,
                "fla_bf16_vs_cpu": _rel(got[sl].cpu(), want[sl]),
                "final_fla_bf16_vs_cpu": _rel(got_final[sl].cpu(), want_final[sl]),
                "torch_fp32_cuda_vs_cpu": _rel(got32[sl].cpu(), want[sl]),
            }
            errs.append(e)
            s += n
    RESULTS[kind] = {"attn": capture_of(gpu).attn, "docs": errs}
    print(json.dumps({kind: RESULTS[kind]}, indent=1))
    if os.environ.get("DFLASH_GPU_OUT"):
        with open(os.path.join(os.environ["DFLASH_GPU_OUT"], "hybrid_gpu.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
    for e in errs:
        assert e["fla_bf16_vs_cpu"] < 3e-2 and e["final_fla_bf16_vs_cpu"] < 3e-2, e
        assert e["torch_fp32_cuda_vs_cpu"] < 1e-4, e
