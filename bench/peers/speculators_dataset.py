"""Run in the speculators venv: the training chunks (``WORK/data/train.jsonl``) as the ``datasets`` table
speculators' ``ArrowDataset`` loads (``input_ids``, ``loss_mask`` all ones, ``seq_len``; torch format), saved to
``OUT`` (its ``hidden_states/`` is written beside it by bench/peers/speculators_features.py)."""

import json
import sys

from datasets import Dataset

src, out = sys.argv[1], sys.argv[2]
with open(src) as f:
    rows = [json.loads(x)["input_ids"] for x in f if x.strip()]
ds = Dataset.from_dict(
    {"input_ids": rows, "loss_mask": [[1] * len(r) for r in rows], "seq_len": [len(r) for r in rows]}
)
ds.set_format("torch")
ds.save_to_disk(out)
print(json.dumps({"rows": len(rows)}))
