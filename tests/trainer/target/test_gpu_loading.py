"""A dense target read onto a GPU (issue 22): fp32 (the file's dtype) by raw_read's threads through their
pinned buffers, bf16 (a cast) through the staging buffers; bit-exact against transformers' from_pretrained,
tensors larger than one buffer included. Run on a GPU machine: ``PYTHONPATH=. python -m pytest tests/trainer/target/test_gpu_loading.py -q``."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.target import loading
from trainer.target.capture import load_target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_load_equals_from_pretrained(tiny_assets, monkeypatch, dtype):
    monkeypatch.setattr(loading._StagedCopy, "CHUNK", 4096)  # many chunks per tensor, both buffers in turn
    monkeypatch.setattr(loading.ParallelRead, "CHUNK", 4096)  # the threads' pinned buffers likewise
    path = str(tiny_assets / "target")  # saved in fp32: bf16 goes through the plain cast path
    model = load_target(path, "cuda", dtype, [0, 1], need_final_hidden=True)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to("cuda").eval()
    got, want = model.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].device.type == "cuda" and got[k].dtype == v.dtype, k
        assert torch.equal(got[k], v), k
