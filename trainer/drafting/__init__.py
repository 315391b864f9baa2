"""The drafter's parts: its config, masks and anchors, RoPE, norms, loss, the target's frozen head, and the
attention/compile switches (``trainer/model.py`` assembles the drafter from them). Imports nothing of the
trainer above it; the target capture (``trainer.target``) reuses its positions, RoPE and attention helpers."""
