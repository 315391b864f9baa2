"""Run in the speculators venv: ``speculators`` as its console script does, after the run-time patches that put
a one-process run on the CPU (``BENCH_PEERS_FORCE_CPU=1``; no patch on a GPU):

- ``speculators.train.trainer.get_local_rank`` -> ``"cpu"``: the trainer moves the model and each batch with
  ``.to(local_rank)``, an accelerator index;
- ``torch.accelerator.synchronize`` -> no-op when there is no accelerator: its step timer calls it."""

import os
import sys

if os.environ.get("BENCH_PEERS_FORCE_CPU") == "1":
    import speculators.train.trainer as trainer
    import torch

    trainer.get_local_rank = lambda: "cpu"
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *a, **k: None

from speculators.cli import app  # noqa: E402

sys.argv = ["speculators", *sys.argv[1:]]
app()
