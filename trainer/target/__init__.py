"""The frozen target: loading it and capturing the hidden states the drafter learns from (``capture``: the
hook path; ``direct``: the compiled per-document layer loop for Qwen3 / Qwen2 / Llama / Mistral)."""
