"""Contract 3 and its numbers: the rows of a results file (rows.py), the append-only results
table that is the contract (table.py, eval/RESULTS.md), the per-language metrics and their
aggregates (metrics.py), and an evaluation-steered mixture's reference run read back from its
table (reference.py). Everything that reads or writes results goes through here."""
