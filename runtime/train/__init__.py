"""The training loop's parts: optimizer and LR schedule, data, metrics, checkpoints."""
