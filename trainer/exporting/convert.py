"""``python -m trainer.export --to speculators|zlab SRC OUT``: a drafter directory written in another layout.

``convert(src, out, to, verifier=None, n_target=None)`` reads SRC's config.json (either layout,
``peers.read_config``: bounded, no link) and validates its safetensors header (``reader``), then writes OUT
(a new or empty directory): config.json in the layout asked for (``peers.to_speculators`` with ``verifier``,
or ``peers.to_zlab``; ``n_target`` fills the ``num_target_layers`` z-lab requires and speculators' format
lacks) and model.safetensors copied byte for byte (the tensor names are the same in both layouts). Both files
0644. ``ReadError`` / ``FormatError`` say why not; nothing is written then.
"""

from __future__ import annotations

import json
import os
import shutil

from trainer.exporting import peers
from trainer.exporting.problems import shown
from trainer.exporting.reader import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    ReadError,
    read_json_object,
    read_safetensors_header,
)

FORMATS = ("speculators", "zlab")


def verifier_archs(verifier: str) -> list[str]:
    """The verifier's ``architectures`` from its config.json when it is a local directory (as speculators'
    ``VerifierConfig.from_pretrained`` records them); ``[]`` for a hub name."""
    path = os.path.join(verifier, CONFIG_NAME)
    if not os.path.isdir(verifier):
        return []
    try:
        archs = read_json_object(path).get("architectures")
    except ReadError as e:
        raise ReadError(f"--verifier {shown(path, 200)} {e}") from None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _config(src: str, to: str, verifier: str | None, n_target: int | None) -> tuple[dict, str]:
    ours, fmt = peers.read_config(src, n_target)
    if to == "zlab":
        if "num_target_layers" not in ours:
            raise ReadError(
                f"{shown(src, 200)} is in {fmt}'s layout, which has no num_target_layers (z-lab requires it): "
                "pass --target TDIR"
            )
        return ours, fmt
    if not verifier:
        raise ReadError("--to speculators needs --verifier PATH_OR_NAME (the target vLLM serves it with)")
    return peers.to_speculators(ours, verifier, verifier_archs(verifier)), fmt


def _out_dir(out: str) -> None:
    if os.path.islink(out) or (os.path.exists(out) and not os.path.isdir(out)):
        raise ReadError(f"{shown(out, 200)} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        raise ReadError(f"{shown(out, 200)} is not empty: nothing is overwritten")
    os.makedirs(out, exist_ok=True)


def convert(src: str, out: str, to: str, verifier: str | None = None, n_target: int | None = None) -> str:
    """Write OUT; returns SRC's layout (``zlab`` or ``speculators``)."""
    cfg, fmt = _config(src, to, verifier, n_target)
    weights = os.path.join(src, WEIGHTS_NAME)
    try:
        read_safetensors_header(weights)  # a regular file, not a link, a valid header
    except ReadError as e:
        raise ReadError(f"{shown(weights, 200)} {e}") from None
    _out_dir(out)
    w_out, c_out = os.path.join(out, WEIGHTS_NAME), os.path.join(out, CONFIG_NAME)
    shutil.copyfile(weights, w_out, follow_symlinks=False)
    with open(c_out, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for p in (w_out, c_out):
        os.chmod(p, 0o644)
    return fmt
