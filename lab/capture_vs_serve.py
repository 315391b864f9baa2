"""The hidden states a drafter trains on against those it is served with, on one (trained) target.

    PYTHONPATH=. python lab/capture_vs_serve.py TARGET_DIR --prompts FILE_OR_DIR --drafter DRAFTER_DIR \
        --device cuda:0 --docs 32 --len 512 [--out OUT.json]

The same documents' features at the drafter's target layers (``--layers`` or the drafter's
``dflash_config.target_layer_ids``), three ways:
- ``train``: the trainer's capture (``capture.load_target`` + ``capture``: its fast path, several documents
  packed in one row with per-document positions; bf16 on CUDA, as the trainer runs it);
- ``serve``: ``trainer.evaluate``'s engine (``StaticTarget`` where it applies, else ``CachedTarget``), each
  document alone by prefill, in the same dtype;
- ``ref``: transformers' own forward of each document alone in fp32 (``output_hidden_states``).
Per captured layer, the relative L2 error (pooled over documents) of train vs ref, serve vs ref and train vs
serve. A drafter trained on ``train`` and served ``serve`` sees the difference between them: when it is at
the level of ``serve`` vs ``ref`` (the dtype's rounding), capture is not why a drafter trails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.evaluation.load import load_target_model  # noqa: E402
from trainer.evaluation.prompts import read_prompts  # noqa: E402
from trainer.target.capture import HOOKS, capture, load_target  # noqa: E402

PACK = 8  # documents per packed row, as the trainer's token budget packs them


def layer_ids(a) -> list[int]:
    if a.layers:
        return [int(x) for x in a.layers.split(",")]
    from trainer.evaluation.load import resolve_drafter_dir

    with open(os.path.join(resolve_drafter_dir(a.drafter), "config.json")) as f:
        return list(json.load(f)["dflash_config"]["target_layer_ids"])


def train_features(a, docs, layers, dtype, fp8_scales: str | None = None, path=None) -> list[torch.Tensor]:
    """Each document's slice of the trainer's packed capture (of ``path``, else the target; ``fp8_scales``:
    through ``--target-dtype fp8`` with those scales)."""
    fp8 = {"target_dtype": "fp8", "fp8_scales": fp8_scales} if fp8_scales else {}
    model = load_target(path or a.target, a.device, dtype, layers, **fp8)
    out = []
    for i in range(0, len(docs), PACK):
        group = docs[i : i + PACK]
        ids = torch.tensor([t for d in group for t in d], device=a.device).view(1, -1)
        doc = torch.cat([torch.full((len(d),), j) for j, d in enumerate(group)]).view(1, -1).to(a.device)
        with torch.no_grad():
            feats, _ = capture(model, ids, doc, layers)
        s = 0
        for d in group:
            out.append(feats[0, s : s + len(d)].float().cpu())
            s += len(d)
    del model
    return out


def serve_features(a, docs, layers, dtype) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """Each document alone through the evaluation's engine (prefill); and the model, for the reference."""
    from trainer.evaluation.spec_decode import CachedTarget
    from trainer.evaluation.static_target import StaticTarget, static_target_problem

    model = load_target_model(a.target, a.device, dtype)
    longest = max(len(d) for d in docs)
    if static_target_problem(model) is None:
        engine = StaticTarget(model, layers, longest + 8, graphs=False)
    else:
        engine = CachedTarget(model, layers)
    out = []
    with torch.no_grad():
        for d in docs:
            _logits, feats = engine.prefill(d)
            out.append(feats.float().cpu())
    return out, model


def ref_features(a, model, docs, layers) -> list[torch.Tensor]:
    """transformers' forward in fp32, each document alone: the decoder layers' outputs through the trainer's
    hook capture (``capture.HOOKS``: the model's own forward, not the fast path)."""
    model.float()
    out = []
    for d in docs:
        ids = torch.tensor([d], device=a.device)
        feats, _ = HOOKS(model, ids, torch.zeros_like(ids), layers, False)
        out.append(feats[0].float().cpu())
    return out


def rel_by_layer(x: list[torch.Tensor], y: list[torch.Tensor], n_layers: int) -> list[float]:
    """Relative L2 error of x against y per captured layer, pooled over documents."""
    num, den = torch.zeros(n_layers), torch.zeros(n_layers)
    for a, b in zip(x, y, strict=True):
        da, db = a.view(a.shape[0], n_layers, -1), b.view(b.shape[0], n_layers, -1)
        num += (da - db).pow(2).sum(dim=(0, 2))
        den += db.pow(2).sum(dim=(0, 2))
    return (num / den).sqrt().tolist()


def fp8_errors(a, docs, layers, dtype, ref, train, res: dict) -> None:
    """``--fp8``: the target written as an FP8 checkpoint in Qwen's block-128 layout (what the acceptance bench's
    ``@fp8`` drafters train on and ``eval_fp8serve`` serves), captured with each scaling; its error per layer
    against ``ref`` (fp32) and ``train`` (the bf16 capture) into ``res``."""
    import tempfile

    from bench.acceptance_fp8 import write_fp8_target

    with tempfile.TemporaryDirectory() as tmp:
        res["fp8_target"] = write_fp8_target(a.target, tmp)
        for scales in filter(None, a.fp8.split(",")):
            fp8 = train_features(a, docs, layers, dtype, scales, path=tmp)
            res[f"fp8{scales}_vs_ref"] = rel_by_layer(fp8, ref, len(layers))
            res[f"fp8{scales}_vs_train"] = rel_by_layer(fp8, train, len(layers))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("--prompts", required=True, help="JSONL file or directory (trainer.evaluate's --prompts)")
    p.add_argument("--drafter", default=None, help="a drafter (or its run) directory: its target_layer_ids")
    p.add_argument("--layers", default=None, help="comma-separated layer ids (instead of --drafter)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--docs", type=int, default=32)
    p.add_argument("--len", type=int, default=512, help="tokens per document (the first LEN of each prompt)")
    p.add_argument(
        "--fp8",
        default="",
        help="also capture the target's FP8 checkpoint (block-128) with these --fp8-scales "
        "(comma-separated, of block and row): each one's error against ref and against train (bf16)",
    )
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not (a.layers or a.drafter):
        p.error("give --drafter or --layers")
    layers = layer_ids(a)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    docs = read_prompts(a.prompts, lambda: None, a.docs, prompt_len=a.len, max_prompt_len=a.len)
    train = train_features(a, docs, layers, dtype)
    serve, model = serve_features(a, docs, layers, dtype)
    ref = ref_features(a, model, docs, layers)
    res = {
        "target": a.target,
        "layers": layers,
        "docs": len(docs),
        "tokens": sum(len(d) for d in docs),
        "dtype": str(dtype),
        "train_vs_ref": rel_by_layer(train, ref, len(layers)),
        "serve_vs_ref": rel_by_layer(serve, ref, len(layers)),
        "train_vs_serve": rel_by_layer(train, serve, len(layers)),
    }
    fp8_errors(a, docs, layers, dtype, ref, train, res)
    for k in [k for k in res if k.endswith(("_ref", "_serve", "_train"))]:
        print(f"{k:18s} " + " ".join(f"L{i}:{e:.2e}" for i, e in zip(layers, res[k], strict=True)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
