"""A real ``specforge export --to hf`` (SpecForge 0.2.0) of a tiny DFlash drafter for the tiny target.

Run in a venv with ``specforge==0.2.0`` (``pip install --no-deps specforge==0.2.0`` over torch 2.13 CPU,
transformers 5.8.1, pydantic, pyyaml, safetensors, huggingface-hub, numpy, accelerate, psutil, tqdm)::

    python lab/peer_formats/make_specforge.py OUT

SpecForge's drafter (``AutoDraftModel.from_config`` on a z-lab-style draft config: 1 layer, hidden 64, block 8,
target layer 3 of 6, mask 127) is initialised at random and saved as its trainer saves a checkpoint
(``training_state.pt`` with ``draft_state_dict``); then SpecForge's own CLI exports it:
``specforge.cli export --to hf --checkpoint CKPT --draft-config CONFIG --output-dir OUT``.
"""

import json
import os
import sys

import torch

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "block_size": 8,
    "num_target_layers": 6,
    "dflash_config": {"mask_token_id": 127, "target_layer_ids": [3]},
}


def main(out: str) -> None:
    from specforge.cli import main as specforge_main
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    work = out.rstrip("/") + ".work"
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, "draft_config.json")
    with open(config, "w") as f:
        json.dump(DRAFT_CONFIG, f, indent=2)
    torch.manual_seed(0)
    model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(config), torch_dtype=torch.bfloat16)
    torch.save({"draft_state_dict": model.state_dict()}, os.path.join(work, "training_state.pt"))
    argv = ["export", "--to", "hf", "--checkpoint", work, "--draft-config", config, "--output-dir", out]
    print("specforge", " ".join(argv))
    sys.exit(specforge_main(argv))


if __name__ == "__main__":
    main(sys.argv[1])
