"""A dense target with safetensors weights is built on the device and read tensor by tensor (issue 22): the
same weights and outputs as transformers' from_pretrained, and byte progress as it reads."""

import torch
from transformers import AutoModelForCausalLM

from trainer.target.capture import load_target


def test_dense_target_loads_like_from_pretrained_with_byte_progress(tiny_assets):
    path = str(tiny_assets / "target")
    calls = []
    model = load_target(
        path, "cpu", torch.float32, [0, 1], need_final_hidden=True, progress=lambda d, t: calls.append((d, t))
    )
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got, want = model.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    total = calls[-1][1]
    assert len(calls) > 3 and calls[-1][0] == total > 0  # per tensor, up to every byte
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    ids = torch.randint(0, ref.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=0, atol=0)
