"""The training loop: the launcher of the ranks, one rank's entry point, the trainer, its loss,
kernel choice, schedule, DeepSpeed config, step row and metrics."""
