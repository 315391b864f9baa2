"""The pipeline's runtime: the target and drafter roles, the hidden-state queue between them, the drafter's
training loop, and the multi-process side (launcher, workers, their control channel, the point-to-point
hand-off, GPU meters)."""
