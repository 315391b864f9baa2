"""``python -m trainer.evaluate``: a drafter's real acceptance by block speculative decoding (thin:
trainer/evaluation/run.py; docs/evaluate.md)."""

from trainer.evaluation.run import main

if __name__ == "__main__":
    raise SystemExit(main())
