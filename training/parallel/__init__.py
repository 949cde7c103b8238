"""Parallelism applied to the single-device model from outside, in a fixed order (TP, activation
checkpointing, PP, ZeRO), the process grid, the parameter layout per TP/PP cut."""
