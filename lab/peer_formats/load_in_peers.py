"""Our exports in the peers' own loaders (run in each peer's venv; orchestrated by ``run_all.sh``).

    python load_in_peers.py zlab DIR             # z-lab dflash 0.1.0: DFlash(2)DraftModel.from_pretrained
    python load_in_peers.py speculators DIR      # speculators 0.9.0: SpeculatorModel.from_pretrained + verifier

Prints one JSON line: the class built, the keys missing / unexpected on load, and whether every tensor of
the file reached the model unchanged.
"""

import json
import sys

import torch
from safetensors.torch import load_file


def _same(model, path: str) -> bool:
    """Every tensor of the file in the model, unchanged (z-lab's DFlash 2 holds the codebooks as embeddings:
    ``candidate_selector.*_codebook`` loads as ``....weight``, its ``key_mapping``)."""
    state = model.state_dict()
    file = load_file(path)
    got = {k: state.get(k, state.get(k + ".weight")) for k in file}
    return all(got[k] is not None and torch.equal(got[k].to(v.dtype), v) for k, v in file.items())


def zlab(d: str) -> dict:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    with open(f"{d}/config.json") as f:
        arch = json.load(f)["architectures"][0]
    cls = DFlash2DraftModel if arch == "DFlash2DraftModel" else DFlashDraftModel
    model, info = cls.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
    return {
        "class": type(model).__name__,
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "weights_equal": _same(model, f"{d}/model.safetensors"),
        "block_size": model.block_size,
        "target_layer_ids": list(model.target_layer_ids),
        "mask_token_id": model.mask_token_id,
    }


def speculators(d: str) -> dict:
    from speculators import SpeculatorModel

    model, info = SpeculatorModel.from_pretrained(d, output_loading_info=True)
    model.load_verifier_weights()
    return {
        "class": type(model).__name__,
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "weights_equal": _same(model, f"{d}/model.safetensors"),
        "block_size": model.block_size,
        "aux_hidden_state_layer_ids": list(model.target_layer_ids),
        "mask_token_id": model.mask_token_id,
        "verifier": model.config.speculators_config.verifier.name_or_path,
    }


if __name__ == "__main__":
    print(
        "RESULT " + json.dumps({"zlab": zlab, "speculators": speculators}[sys.argv[1]](sys.argv[2])),
        flush=True,
    )
