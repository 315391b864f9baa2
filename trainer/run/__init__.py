"""The run directory and a run's settings: run.json, metrics.jsonl and meters (``rundir``), checkpoints,
flags, the LR/noise schedules and the stop signals. No torch at import time."""
