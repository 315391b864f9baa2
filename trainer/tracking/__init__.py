"""Experiment tracking (``--report-to tensorboard,wandb,mlflow``; docs/trainer.md "Experiment tracking").

- ``dispatcher``: the run's trackers, fed from the MetricsWriter in background threads (``start``);
- ``records``: metrics.jsonl records as points, one naming for every tracker;
- ``state``: RUN_DIR/tracking.json, the runs a resumed trainer continues;
- ``base``: Context and Tracker; one module per tracker: ``tensorboard_tracker``, ``wandb_tracker``,
  ``mlflow_tracker`` (each imports its library only when it opens).
"""
