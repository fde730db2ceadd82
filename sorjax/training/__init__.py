"""Training: schedules, optimisers, checkpoints, metrics."""
