"""Does a speculators drafter compute the same thing in our trainer? The recorded speculators DFlash 1 and 2
exports (tests/data/peers/) run in speculators' own ``_backbone_forward`` (its training forward: all
anchors of one document, sdpa, fp32) and in our ``DFlashDrafter`` as ``trainer.evaluate`` loads it, on the
same inputs and anchors; prints the largest difference of the normed block states.

    SPEC/bin/python lab/peer_formats/same_function.py speculators PEER_DIR TARGET OUT.safetensors
    PYTHONPATH=. .venv/bin/python lab/peer_formats/same_function.py ours PEER_DIR TARGET OUT.safetensors

TARGET: the tiny target the exports were made for (``python -m trainer.tiny``); its embedding feeds both.
"""

import sys

import torch
from safetensors.torch import load_file, save_file

T, FIRST, BLOCK = (
    48,
    4,
    8,
)  # anchors FIRST .. T - BLOCK - 1: every valid one, so speculators' draw is all of them


def _inputs(hidden: int, n_aux: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, T, n_aux * hidden, generator=g),
        "input_ids": torch.randint(0, 127, (1, T), generator=g),
        "loss_mask": torch.cat([torch.zeros(1, FIRST), torch.ones(1, T - FIRST)], 1),
    }


def speculators(peer: str, target: str, out: str) -> None:
    from speculators import SpeculatorModel

    model = SpeculatorModel.from_pretrained(peer, verifier=target).float().eval()
    model.config.transformer_layer_config._attn_implementation = "sdpa"
    model._create_mask_fn = __import__(
        "torch.nn.attention.flex_attention", fromlist=["create_mask"]
    ).create_mask
    model.load_verifier_weights()
    tl = model.config.transformer_layer_config
    x = _inputs(tl.hidden_size, len(model.target_layer_ids))
    n = T - BLOCK - FIRST
    with torch.no_grad():
        hidden, *_ = model._backbone_forward(
            x["hidden_states"], x["input_ids"], x["loss_mask"], torch.zeros(1, T, tl.hidden_size),
            torch.zeros(1, T, dtype=torch.long), max_anchors=n,
        )  # fmt: skip
    save_file({**x, "hidden": hidden.contiguous(), "anchors": torch.arange(FIRST, FIRST + n)[None]}, out)


def ours(peer: str, target: str, out: str) -> None:
    from trainer.evaluation.load import load_drafter_any

    drafter, cfg = load_drafter_any(peer, target, "cpu", torch.float32)
    got = load_file(out)
    embed = torch.nn.Embedding.from_pretrained(
        load_file(f"{target}/model.safetensors")["model.embed_tokens.weight"]
    )
    with torch.no_grad():
        mine = drafter(got["hidden_states"], got["input_ids"], torch.zeros(1, T, dtype=torch.long),
                       got["anchors"], embed, attn_impl="sdpa")  # fmt: skip
    theirs = got["hidden"].view_as(mine)
    print(f"{cfg.arch}: max |ours - speculators| = {(mine - theirs).abs().max().item():.3e} "
          f"(states of size {theirs.abs().max().item():.2f}, {tuple(theirs.shape)})")  # fmt: skip


if __name__ == "__main__":
    {"speculators": speculators, "ours": ours}[sys.argv[1]](*sys.argv[2:5])
