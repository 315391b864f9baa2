"""``python -m trainer.regenerate``: the target writes the responses of a prompt file (docs/trainer.md
"Regenerating responses with the target")."""
