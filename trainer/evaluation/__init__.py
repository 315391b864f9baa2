"""Real acceptance: block speculative decoding with a trained drafter (``python -m trainer.evaluate``), and the
in-training evaluation of saved checkpoints (docs/evaluate.md)."""
