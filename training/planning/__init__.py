"""What a layout costs before it runs: FLOPs per sample and step, memory per rank, the planner."""
