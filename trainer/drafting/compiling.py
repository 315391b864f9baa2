"""Whether the trainer may ``torch.compile`` its hot paths on CUDA: ``DFLASH_COMPILE=0`` turns every such
compile off (drafter layers, loss chunks, target layer steps), e.g. to rule compilation out when debugging."""

from __future__ import annotations

import os
import warnings


def compile_enabled() -> bool:
    return os.environ.get("DFLASH_COMPILE", "1") != "0"


# inductor warns on every compile that splits a softmax reduction ("Online softmax is disabled on the fly
# since Inductor decides to split the reduction ..."): nothing a user of the trainer can act on, and it filled
# train.log. Only that exact message is silenced; it begins with a newline, and the filter's pattern is matched
# at the message's start, so it allows leading white space.
warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled")
