"""Packed vs alone on a hybrid target: relative L2 error of each document's captured features, before
(transformers on the packed row with per-document positions: the old hook path) and now (trainer/target/hybrid.py).

    .venv/bin/python -m trainer.tiny /tmp/hy --target qwen3_5 --docs 40
    PYTHONPATH=. .venv/bin/python bench/hybrid_packing.py /tmp/hy/target

The reference is each document alone through transformers' own modules (one document per row, exact)."""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from trainer.drafting.masks import doc_positions
from trainer.target.capture import capture, decoder_of, load_target

LENS = [40, 3, 1, 30]
LAYERS = [1, 3, 4, 7]


def main(path: str) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 120, (1, sum(LENS)))
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(LENS)]).view(1, -1)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    base, got = decoder_of(ref), {}
    hooks = [
        base.layers[i].register_forward_hook(
            lambda _m, _a, o, i=i: got.__setitem__(i, o[0] if isinstance(o, tuple) else o)
        )
        for i in LAYERS
    ]
    with torch.no_grad():
        base(input_ids=ids, position_ids=doc_positions(doc), use_cache=False)
    for h in hooks:
        h.remove()
    before = torch.cat([got[i] for i in LAYERS], -1)
    model = load_target(path, "cpu", torch.float32, LAYERS)
    now, _ = capture(model, ids, doc, LAYERS)
    print(f"{type(ref).__name__}: document length, relative L2 error before -> now")
    s = 0
    for n in LENS:
        alone, _ = capture(ref, ids[:, s : s + n], torch.zeros(1, n), LAYERS)
        rel = [float((x[:, s : s + n] - alone).norm() / alone.norm()) for x in (before, now)]
        print(f"  {n:3d} tokens: {rel[0]:.2e} -> {rel[1]:.2e}")
        s += n


if __name__ == "__main__":
    main(sys.argv[1])
