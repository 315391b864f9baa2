"""The frozen head built from the target loaded in the same process: shared storage, no second read of its
tensors, the same losses as the head read from the files; file read kept for what the target lacks."""

import copy

import pytest
import torch

from tests.support.model_util import cpu_drafter_role
from tests.support.trainer_run import tiny_flags
from trainer.drafting import head as head_mod
from trainer.drafting.head import FrozenHead
from trainer.run.flags import build_parser
from trainer.run.settings import resolve
from trainer.runtime.common import quiet_transformers
from trainer.runtime.loop import Trainer
from trainer.runtime.shared_head import head_from_target
from trainer.runtime.sources import ThreadedSource
from trainer.target.capture import load_target


def _is_head_key(k: str) -> bool:  # the final norm, not a layer's norms
    return k.endswith(("embed_tokens.weight", "lm_head.weight")) or k in (
        "model.norm.weight",
        "model.language_model.norm.weight",
    )


@pytest.fixture
def reads(monkeypatch):
    """Every key FrozenHead reads (``safe_open(...).get_tensor`` in trainer/drafting/head.py)."""
    seen: list[str] = []
    real = head_mod.safe_open

    class Recording:
        def __init__(self, *a, **k):
            self.h = real(*a, **k)

        def get_tensor(self, key):
            seen.append(key)
            return self.h.get_tensor(key)

        def keys(self):
            return self.h.keys()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(head_mod, "safe_open", Recording)
    return seen


def _ptrs(head: FrozenHead) -> tuple[int, int, int]:
    return (head.embed_tokens.weight.data_ptr(), head.norm.weight.data_ptr(), head.lm_head.weight.data_ptr())


def _assert_same_values(a: FrozenHead, b: FrozenHead) -> None:
    for n in ("embed_tokens", "norm", "lm_head"):
        assert torch.equal(getattr(a, n).weight, getattr(b, n).weight), n
    assert a.norm.eps == b.norm.eps


@pytest.mark.e2e
def test_single_process_trainer_shares_the_targets_tensors_and_trains_the_same(tiny_assets, tmp_path, reads):
    quiet_transformers()
    args = resolve(build_parser().parse_args(tiny_flags(tiny_assets, tmp_path / "run")))
    devices = args.devices()
    source = ThreadedSource(args, devices, None, None)
    trainer = Trainer(args, source, None, None, str(tmp_path / "run"), None, device=devices.drafter[0])
    trainer.setup()
    t = trainer.state  # the drafter's state: its head, drafter, plan, config
    target = source.target_roles[0].model
    assert not [k for k in reads if _is_head_key(k)], reads  # nothing of the head read from the files
    assert _ptrs(t.head) == (
        target.model.embed_tokens.weight.data_ptr(),
        target.model.norm.weight.data_ptr(),
        target.lm_head.weight.data_ptr(),
    )
    assert not any(p.requires_grad for p in t.head.parameters())
    assert not any(p.requires_grad for p in target.parameters())

    from_files = FrozenHead.from_pretrained(args.target_model, dtype=torch.float32, device="cpu")
    _assert_same_values(t.head, from_files)
    # one micro-batch, the same drafter state and seed: bit-identical loss, metrics and gradients
    hb = source.target_roles[0](t.plan.batch(0))
    drafters = [t.drafter, copy.deepcopy(t.drafter)]
    outs = []
    for drafter, head in zip(drafters, (t.head, from_files), strict=True):
        role = cpu_drafter_role(
            drafter,
            head,
            block_size=t.cfg.block_size,
            max_anchors=args.max_anchors,
            gamma=args.gamma,
            noise_type=args.noise_type,
            grad_clip=args.grad_clip,
        )
        outs.append(role.micro_step(hb, 0.1, 1.0, seed=7))
    assert outs[0].keys() == outs[1].keys()
    for k in outs[0]:
        assert torch.equal(outs[0][k], outs[1][k]), k
    for p, q in zip(drafters[0].parameters(), drafters[1].parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad)


def test_tied_embeddings_share_one_tensor(tmp_path, reads):
    from tests.support.model_util import tiny_target

    tiny_target(seed=3, tie_word_embeddings=True).save_pretrained(tmp_path)
    model = load_target(str(tmp_path), "cpu", torch.float32, [0, 1])
    reads.clear()
    head = head_from_target(str(tmp_path), model, "cpu", torch.float32)
    assert not [k for k in reads if _is_head_key(k)], reads
    assert head.lm_head.weight is head.embed_tokens.weight
    assert head.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    _assert_same_values(head, FrozenHead.from_pretrained(tmp_path, dtype=torch.float32))


def test_hybrid_target_zero_centred_norm(tiny_hybrid, reads):
    path = str(tiny_hybrid / "target")
    model = load_target(path, "cpu", torch.float32, [0, 1])
    reads.clear()
    head = head_from_target(path, model, "cpu", torch.float32)
    assert not [k for k in reads if _is_head_key(k)], reads
    assert head.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert head.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    # (1 + w), as the file read stores it: the same values, a new (hidden-sized) tensor
    _assert_same_values(head, FrozenHead.from_pretrained(path, dtype=torch.float32))
    h = torch.randn(2, 3, head.norm.weight.shape[0])
    assert torch.equal(head.logits(h, prenorm=True), model.lm_head(model.model.norm(h)))


def test_what_the_target_lacks_is_read_from_the_files(tmp_path, reads):
    from tests.support.model_util import tiny_target

    tiny_target(seed=1).save_pretrained(tmp_path)
    model = load_target(str(tmp_path), "cpu", torch.float32, [0, 1])
    model.lm_head = torch.nn.Linear(64, model.lm_head.out_features, bias=False, device="meta")  # not loaded
    del model.model.norm  # a target cut after its last captured layer, without its final norm
    reads.clear()
    head = head_from_target(str(tmp_path), model, "cpu", torch.float32)
    assert sorted(reads) == ["lm_head.weight", "model.norm.weight"]
    assert head.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    _assert_same_values(head, FrozenHead.from_pretrained(tmp_path, dtype=torch.float32))
    # another dtype than the target's: everything read, nothing shared
    reads.clear()
    full = load_target(str(tmp_path), "cpu", torch.float32, [0, 1])
    bf = head_from_target(str(tmp_path), full, "cpu", torch.bfloat16)
    assert sorted(reads) == ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]
    assert bf.embed_tokens.weight.dtype == torch.bfloat16
