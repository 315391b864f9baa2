"""Run in the speculators venv: a speculators DFlash checkpoint (``config.json`` with ``transformer_layer_config``,
``aux_hidden_state_layer_ids`` = z-lab's ids + 1, ``mask_token_id``; ``model.safetensors``) written in z-lab's
layout, which both evaluators read: the draft body's tensors as they are (``layers.*``, ``fc``,
``hidden_norm``, ``norm``: z-lab's names; speculators' own converter copies them the other way), the verifier's
copies (``embed_tokens``, ``lm_head``, ``verifier_*``, ``t2d``/``d2t``) left out; fp32.

    python speculators_convert.py SRC DEST TARGET_DIR"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

DROP = ("embed_tokens.", "lm_head.", "verifier_lm_head.", "verifier_norm.", "t2d", "d2t")

src, dest, target = sys.argv[1:4]
with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
with open(os.path.join(target, "config.json")) as f:
    tcfg = json.load(f)
weights = {}
for name in sorted(os.listdir(src)):
    if name.endswith(".safetensors"):
        weights.update(load_file(os.path.join(src, name)))
body = {k: v.to(torch.float32).contiguous() for k, v in weights.items() if not k.startswith(DROP)}
top = dict(cfg["transformer_layer_config"])
top.update({"architectures": ["DFlashDraftModel"], "model_type": top.get("model_type", "qwen3"),
            "block_size": cfg["block_size"], "num_target_layers": tcfg["num_hidden_layers"],
            "torch_dtype": "float32",
            "dflash_config": {"target_layer_ids": [i - 1 for i in cfg["aux_hidden_state_layer_ids"]],
                              "mask_token_id": cfg["mask_token_id"]}})  # fmt: skip
os.makedirs(dest, exist_ok=True)
with open(os.path.join(dest, "config.json"), "w") as f:
    json.dump(top, f, indent=1)
save_file(body, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
print(
    json.dumps(
        {"tensors": len(body), "dropped": sorted(set(weights) - set(body)), "config": top["dflash_config"]}
    )
)
