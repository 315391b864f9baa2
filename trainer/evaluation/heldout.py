"""``--eval-data est-holdout``: evaluate on the sequences ``--est-holdout`` holds out of training.

The trainer's plan holds ``--est-holdout N`` sequences of ``--data-dir`` out of training (``data.dataset.held_out``:
drawn once from ``--seed``); with this keyword the evaluations of ``--eval-every`` decode from them too: a
validation split of the run's own data, never trained on. A thread reads the data as the plan does and writes
those sequences (``input_ids`` and ``loss_mask``, in the training format) to ``evals/est-holdout.jsonl``, whose
prompts ``trainer.evaluate`` takes as it takes any tokenized line (the part before the first trained token, else
the first ``--prompt-len`` tokens). Evaluations wait for it; a failure is said once and none runs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

KEYWORD = "est-holdout"
FILE = "est-holdout.jsonl"


def write_prompts(args, path: str) -> int:
    """The held-out sequences of the run's plan as a JSONL file at ``path`` (atomic); how many."""
    from trainer.data.dataset import held_out, load_dir
    from trainer.run.rundir import atomic_write_text, own_dir

    ds = load_dir(args.data_dir, args.max_seq_len)
    lines = []
    for s in held_out(len(ds), args.est_holdout, args.seed):
        a, b = int(ds.offsets[s]), int(ds.offsets[s + 1])
        rec = {"input_ids": ds.tokens[a:b].tolist(), "loss_mask": ds.mask[a:b].astype(int).tolist()}
        lines.append(json.dumps(rec, separators=(",", ":")) + "\n")
    own_dir(os.path.dirname(path))
    atomic_write_text(path, "".join(lines))
    return len(lines)


def write_in_thread(args, path: str, failed: Callable[[str], None]) -> threading.Event:
    """``write_prompts`` in a daemon thread; the event is set when it ends (``failed(message)`` first if it failed)."""
    done = threading.Event()

    def run() -> None:
        try:
            write_prompts(args, path)
        except Exception as e:  # bad data, a full disk: the run trains on, without evaluations
            failed(f"{type(e).__name__}: {e}")
        finally:
            done.set()

    threading.Thread(target=run, name="dflash-eval-prompts", daemon=True).start()
    return done
