"""speculators' offline features as vLLM's hidden-states connector writes them (hs_connectors ``FileTransfer``):
``DIR/hidden_states/hs_I.safetensors`` with ``hidden_states`` [seq, n + 1, hidden] (the drafter's target layers
in order, then the verifier's last layer, before its final norm) and ``token_ids`` [seq]; ``DIR`` itself is the
``datasets`` table (``input_ids``, ``loss_mask``, ``seq_len``; torch format) that ``speculators.train`` loads,
written in the speculators venv (``speculators_dataset.py``)."""

from __future__ import annotations

import os


def write(out_dir: str, index: int, ids, layers, last) -> None:
    import torch
    from safetensors.torch import save_file

    n = layers.shape[-1] // last.shape[-1]
    stack = torch.cat([layers.reshape(layers.shape[0], n, -1), last.unsqueeze(1)], dim=1).contiguous()
    path = os.path.join(out_dir, "hidden_states", f"hs_{index}.safetensors")
    save_file({"hidden_states": stack, "token_ids": ids.contiguous()}, path)
