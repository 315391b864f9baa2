"""What the runtime's modules share, below all of them: exit codes, the log line writer, the micro-batch seed,
the run's step count and drafter config from the flags, transformers' quiet set-up, a GPU's UUID.

No module of ``trainer.runtime`` that this one serves is imported here (the loop, the warm-up, the
workers and the launcher all import it; nothing imports back)."""

from __future__ import annotations

import os
import socket
import sys

from trainer.data.dataset import Plan
from trainer.run.flags import FlagError, dflash2_flags, flag_for_setting

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NAN, EXIT_SAVE_FAILED = 0, 1, 2, 3, 4


class Logger:
    """Log lines to stdout (train.log), each after ``prefix``: a worker's ``"[drafter0 cuda:1] "``, none in
    the launcher or the one process of a single-process run."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, msg: str) -> None:
        print(self.prefix + msg, flush=True)


log = Logger()  # the launcher's and the single process's


def micro_seed(seed: int, g: int) -> int:
    """The anchor/noise generator's seed for micro-batch ``g`` (a function of the seed and ``g`` only)."""
    return (seed * 1_000_003 + g * 7_919 + 1) % (2**63 - 1)


def node_name() -> str:
    """This worker's node as its scheduler names it (Slurm's node name, which ``squeue`` shows; several
    slurmd may share one host name), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gpu_uuid(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    try:
        u = str(torch.cuda.get_device_properties(int(device.split(":")[1])).uuid)
        return u if u.startswith("GPU-") else f"GPU-{u}"
    except Exception:  # noqa: BLE001 - older torch: no uuid
        return None


def total_steps_of(plan: Plan, grad_accum: int, replicas: int, max_steps: int | None) -> int:
    total = plan.total // (grad_accum * replicas)
    if max_steps:
        total = min(total, max_steps)
    if total < 1:
        raise FlagError(
            "--grad-accum",
            f"the data gives {plan.total} micro-batches, fewer than --grad-accum "
            f"{grad_accum} x {replicas} drafter replica(s): not one optimizer step",
        )
    return total


def draft_config(args):
    from transformers import AutoConfig

    from trainer.drafting.config import DraftConfig

    try:
        tcfg = AutoConfig.from_pretrained(args.target_model)
        return DraftConfig.from_target_config(
            tcfg,
            num_draft_layers=args.num_draft_layers,
            block_size=args.block_size,
            mask_token_id=args.mask_token_id,
            target_layer_ids=args.target_layer_ids,
            layer_types=args.layer_types,
            sliding_window=args.sliding_window,
            arch=getattr(args, "arch", None) or "dflash",
            dflash2=dflash2_flags(args),
        )
    except ValueError as e:
        raise FlagError(flag_for_setting(e), str(e)) from None


def quiet_transformers() -> None:
    """transformers as the trainer runs it: no scikit-learn (``without_sklearn``), errors only, no progress bars.
    Called before anything else imports transformers' models."""
    without_sklearn()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # e.g. the load report of the deliberately truncated target
    hf_logging.disable_progress_bar()


def without_sklearn() -> None:
    """Tell transformers that scikit-learn is not installed, unless something imported it already.

    transformers (up to at least 5.17) imports scikit-learn with its generation utilities, which every model
    class pulls in, for one thing: the confidence threshold of *assisted* generation (``candidate_generator``),
    which this trainer never runs. On an H200 host that import was 1.5-2 s of every start (issue 22's profile;
    newer transformers import it lazily). The check is ``is_sklearn_available()``, read when
    ``candidate_generator`` is imported: patched here on the two modules that define and re-export it."""
    if "sklearn" in sys.modules or "transformers.generation.candidate_generator" in sys.modules:
        return
    import transformers.utils as hf_utils
    from transformers.utils import import_utils

    def unavailable() -> bool:
        return False

    for mod in (hf_utils, import_utils):
        if hasattr(mod, "is_sklearn_available"):
            mod.is_sklearn_available = unavailable
