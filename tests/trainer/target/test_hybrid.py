"""Hybrid linear-attention targets (Qwen3.5 / Qwen3.6): per-document capture and text-only loading.

The reference for a document is the document captured ALONE by transformers' own modules (the hook
path, one document per row, where transformers is exact); the packed capture must equal it for every
document of a row, whatever its length (1 token, shorter and longer than the conv width 4)."""

from __future__ import annotations

import pytest
import torch

from trainer.target import loading
from trainer.target.base import attach
from trainer.target.capture import capture, capture_of, load_target

LENS = (40, 3, 1, 30)
LAYERS = [1, 3, 4, 7]  # GDN and attention layers, up to the last of the 8


def _row(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 120, (1, sum(LENS)), generator=g)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(LENS)]).view(1, -1)
    return ids, doc


def _reference(path):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    attach(ref, None)  # the hook path: transformers' own layers
    return ref


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", ["tiny_hybrid", "tiny_hybrid_moe"])
def test_packed_capture_equals_each_document_alone(kind, request):
    target = request.getfixturevalue(kind) / "target"
    ref = _reference(target)
    model = load_target(str(target), "cpu", torch.float32, LAYERS, need_final_hidden=True)
    assert capture_of(model).kind == "hybrid" and capture_of(model).linear == "torch"
    ids, doc = _row()
    # a second row: the same documents in another order, right-padded (doc id -1)
    order = [3, 1, 0, 2]
    ids2 = torch.cat([ids[:, sum(LENS[:i]) : sum(LENS[: i + 1])] for i in order] + [ids[:, :2]], dim=1)
    doc2 = torch.cat([torch.full((LENS[i],), j) for j, i in enumerate(order)] + [torch.full((2,), -1)])
    ids_b = torch.cat([torch.cat([ids, ids[:, :2]], 1), ids2])
    doc_b = torch.cat([torch.cat([doc, torch.full((1, 2), -1)], 1), doc2.view(1, -1)])
    got, final = capture(model, ids_b, doc_b, LAYERS, need_final_hidden=True)
    for row in range(2):
        s = 0
        for n, d in ((LENS[i], i) for i in ([0, 1, 2, 3] if row == 0 else order)):
            alone, alone_final = capture(
                ref, ids[:, sum(LENS[:d]) : sum(LENS[: d + 1])], torch.zeros(1, n), LAYERS, True
            )
            assert _rel(got[row : row + 1, s : s + n], alone) < 1e-5, (kind, row, n)
            assert _rel(final[row : row + 1, s : s + n], alone_final) < 1e-5, (kind, row, n)
            s += n


def test_transformers_leaks_state_across_documents(tiny_hybrid):
    """Why the hybrid path exists: transformers' packed row differs from the documents alone after the
    first document (conv and recurrent state carried over), and the hook path refuses such rows."""
    from trainer.drafting.masks import doc_positions
    from trainer.target.capture import decoder_of

    ref = _reference(tiny_hybrid / "target")
    ids, doc = _row()
    with pytest.raises(ValueError, match="one document per row"):
        capture(ref, ids, doc, LAYERS)
    base, got = decoder_of(ref), {}
    hook = base.layers[LAYERS[-1]].register_forward_hook(lambda _m, _a, out: got.setdefault("h", out))
    with torch.no_grad():
        base(input_ids=ids, position_ids=doc_positions(doc), use_cache=False)
    hook.remove()
    h = got["h"][0] if isinstance(got["h"], tuple) else got["h"]
    s = 0
    for i, n in enumerate(LENS):
        alone, _ = capture(ref, ids[:, s : s + n], torch.zeros(1, n), [LAYERS[-1]])
        err = _rel(h[:, s : s + n], alone)
        assert err < 1e-5 if i == 0 else err > 1e-4, (n, err)
        s += n


class _Recording:
    """Wraps safetensors.safe_open and records every tensor read."""

    def __init__(self, real, seen: list[str]):
        self.real, self.seen = real, seen

    def __call__(self, *a, **k):
        handle = self.real(*a, **k)
        seen = self.seen

        class H:
            def get_tensor(self, key):
                seen.append(key)
                return handle.get_tensor(key)

            def keys(self):
                return handle.keys()

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc) if hasattr(handle, "__exit__") else None

        return H()


@pytest.mark.parametrize("need_final", [False, True])
def test_text_only_loading_reads_no_vision_mtp_or_later_layer(tiny_hybrid_moe, monkeypatch, need_final):
    target = tiny_hybrid_moe / "target"
    all_keys = set(loading.weight_map(str(target)))
    assert any(k.startswith("model.visual.") for k in all_keys) and any(
        k.startswith("mtp.") for k in all_keys
    )
    seen: list[str] = []
    monkeypatch.setattr(loading, "safe_open", _Recording(loading.safe_open, seen))
    add = loading.ParallelRead.add  # tensors stored as the model holds them are read by raw_read

    def record_add(self, file, key, entry, dst):
        seen.append(key)
        return add(self, file, key, entry, dst)

    monkeypatch.setattr(loading.ParallelRead, "add", record_add)
    model = load_target(str(target), "cpu", torch.float32, [1, 3], need_final_hidden=need_final)
    keep = 8 if need_final else 4
    assert len(model.model.layers) == keep
    assert not [k for k in seen if k.startswith(("model.visual.", "mtp."))]
    layers = {int(k.split(".")[3]) for k in seen if k.startswith("model.language_model.layers.")}
    assert layers == set(range(keep))
    want = {
        k
        for k in all_keys
        if k.startswith("model.language_model.")
        and (not k.startswith("model.language_model.layers.") or int(k.split(".")[3]) < keep)
    } | {"lm_head.weight"}
    assert set(seen) == want  # every needed tensor, each read once, nothing else
    assert len(seen) == len(want)
    # the weights are the checkpoint's (the fused MoE experts included): same features as transformers'
    ref = _reference(target)
    ids, doc = _row(1)
    a, _ = capture(model, ids[:, :40], doc[:, :40], [1, 3])
    b, _ = capture(ref, ids[:, :40], doc[:, :40], [1, 3])
    assert _rel(a, b) < 1e-5
