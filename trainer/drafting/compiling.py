"""Whether the trainer may ``torch.compile`` its hot paths on CUDA: ``DFLASH_COMPILE=0`` turns every such
compile off (drafter layers, loss chunks, target layer steps), e.g. to rule compilation out when debugging."""

from __future__ import annotations

import os


def compile_enabled() -> bool:
    return os.environ.get("DFLASH_COMPILE", "1") != "0"
