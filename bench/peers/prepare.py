"""The peers' common inputs (bench/peers): corpus chunks, held-out prompts, the target, and the target's
hidden states written in each peer's offline layout. Runs in the project's venv (transformers, torch).

- ``data/train.jsonl``: the training chunks (``input_ids``, every token trained), ``trainer.pipeline``'s input;
- ``heldout/prompts.jsonl``: held-out chunks whose first ``PROMPT`` bytes are the evaluation's prompts;
- ``target/``: the dense stdlib-style Qwen3 byte target (bench/acceptance_target.py), trained here once and
  reused by a later run of the same seed, size and steps (its ``bench_target.json``);
- ``features_specforge/NNNNN.ckpt``: SpecForge's offline DFlash features (``torch.save`` of a dict:
  ``input_ids`` [seq], ``loss_mask`` [seq], ``hidden_states`` [seq, n x hidden], the target layers' states
  concatenated in ``aux_hidden_state_layer_ids`` order), as its ``prepare_hidden_states`` would write them;
- ``features_speculators/hs_I.safetensors``: speculators' vLLM-written layout (``speculators_features.py``).
"""

from __future__ import annotations

import json
import os
import time

from bench import acceptance_target
from bench.bench_acceptance import chunks, corpus, corpus_id, heldout_chunks, write_jsonl

SEQ = acceptance_target.SEQ


def settings(size: str, seed: int, n_chunks: int, n_prompts: int, target_steps: int, device: str) -> dict:
    dims = acceptance_target.target_dims(size, "qwen3", "d512")
    return {"size": size, "seed": seed, "chunks": n_chunks, "prompts": n_prompts, "target_dims": dims,
            "target_sched": {"steps": target_steps, "batch": 16, "device": device}}  # fmt: skip


def prepare_text(work: str, s: dict) -> dict:
    train, held, nfiles = corpus(None)
    write_jsonl(os.path.join(work, "data", "train.jsonl"), chunks(train, s["chunks"], s["seed"]))
    write_jsonl(os.path.join(work, "heldout", "prompts.jsonl"), heldout_chunks(held, s["prompts"], s["seed"]))
    return {"corpus": corpus_id(train, held, nfiles), "train": train, "held": held}


def target(work: str, s: dict, text: dict) -> dict:
    """The trained target in ``work/target``: reused when an earlier run trained it with these settings."""
    dest = os.path.join(work, "target")
    facts_path = os.path.join(dest, "bench_target.json")
    want = {"dims": s["target_dims"], "sched": s["target_sched"], "seed": s["seed"],
            "corpus": text["corpus"]["sha256"]}  # fmt: skip
    if os.path.isfile(facts_path):
        with open(facts_path) as f:
            facts = json.load(f)
        if facts.get("want") == want:
            return {**facts["target"], "reused": True}
    held_chunks = chunks(text["held"], 64, s["seed"] + 1)
    t = acceptance_target.train_target(
        s["target_dims"], s["target_sched"], text["train"], held_chunks, dest, s["seed"]
    )
    with open(facts_path, "w") as f:
        json.dump({"want": want, "target": t}, f, indent=1)
    return t


def read_chunks(work: str) -> list[list[int]]:
    with open(os.path.join(work, "data", "train.jsonl")) as f:
        return [json.loads(x)["input_ids"] for x in f if x.strip()]


def capture(target_dir: str, seqs: list[list[int]], layer_ids: list[int], batch: int = 16):
    """Yield (index, input_ids, layers [seq, n x hidden], last [seq, hidden]) for each sequence, fp32 on the CPU:
    the outputs of target layers ``layer_ids`` (z-lab numbering: hidden_states[i + 1]) concatenated, and the last
    layer's output before the final norm (what vLLM captures as its last layer; speculators applies the
    verifier's norm itself). Taken by forward hooks on the decoder layers, as a server captures them."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    layers = model.model.layers
    want = sorted(set(layer_ids) | {len(layers) - 1})
    got: dict[int, torch.Tensor] = {}

    def hook(i):
        def fn(_mod, _inp, out):
            got[i] = out[0] if isinstance(out, tuple) else out

        return fn

    handles = [layers[i].register_forward_hook(hook(i)) for i in want]
    try:
        with torch.no_grad():
            for i in range(0, len(seqs), batch):
                x = torch.tensor(seqs[i : i + batch])
                model.model(input_ids=x)
                cat = torch.cat([got[j] for j in layer_ids], dim=-1)
                for k in range(x.shape[0]):
                    yield i + k, x[k], cat[k], got[len(layers) - 1][k]
    finally:
        for h in handles:
            h.remove()


def _stamp(work: str, layer_ids: list[int]) -> dict:
    """What the feature files depend on: the chunks, the target's weights, the layers."""
    import hashlib

    h = hashlib.sha256()
    for rel in (("data", "train.jsonl"), ("target", "model.safetensors")):
        with open(os.path.join(work, *rel), "rb") as f:
            h.update(f.read())
    return {"layer_ids": layer_ids, "sha256": h.hexdigest()}


def write_features(work: str, layer_ids: list[int], which: tuple[str, ...], before=None) -> dict:
    """Both peers' feature files from one pass of the target over the training chunks; its seconds. Reused (with
    the seconds they took, which the peers' end-to-end figure still counts) when an earlier run wrote them for
    the same chunks, target and layers (``features.json``); else the old ones are removed and ``before()`` (the
    speculators table, which must be written into an empty folder) runs first."""
    import shutil

    import torch

    from bench.peers import speculators_features

    stamp_path, stamp = os.path.join(work, "features.json"), _stamp(work, layer_ids)
    if os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            old = json.load(f)
        if old.get("stamp") == stamp and set(which) <= set(old.get("which", [])):
            return {**old["facts"], "reused": True}
    seqs = read_chunks(work)
    for d in ("features_specforge", "features_speculators"):
        shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    if before is not None:
        before()
    sf_dir = os.path.join(work, "features_specforge")
    sp_dir = os.path.join(work, "features_speculators")
    for d in (sf_dir, os.path.join(sp_dir, "hidden_states")):
        os.makedirs(d, exist_ok=True)
    t0 = time.monotonic()
    target_dir = os.path.join(work, "target")
    for i, ids, layers, last in capture(target_dir, seqs, layer_ids):
        if "specforge" in which:
            torch.save({"input_ids": ids.clone(), "loss_mask": torch.ones_like(ids),
                        "hidden_states": layers.clone()}, os.path.join(sf_dir, f"{i:06d}.ckpt"))  # fmt: skip
        if "speculators" in which:
            speculators_features.write(sp_dir, i, ids, layers, last)
    facts = {
        "seconds": time.monotonic() - t0,
        "sequences": len(seqs),
        "layer_ids": layer_ids,
        "which": list(which),
    }
    with open(stamp_path, "w") as f:
        json.dump({"stamp": stamp, "which": list(which), "facts": facts}, f)
    return facts
