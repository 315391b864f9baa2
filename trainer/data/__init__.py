"""Training data: the tokenized JSONL format and its packing into micro-batches (``dataset``), chat data to
that format (``prepare``, ``python -m trainer.prepare``), and the tiny offline target and data set of the
demo and tests (``tiny``, ``python -m trainer.tiny``)."""
