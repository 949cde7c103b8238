"""What a prepare run writes and how it is laid out: the shards (contract 1, ``data_prep/FORMAT.md``),
the drop log and scores, the run folder."""
