"""The trainer's data: prepared shards read in place, the dynamic-batch sampler, the language mixture."""
