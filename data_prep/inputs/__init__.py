"""Reading the inputs: discovery and chunk planning, and the bounded readers of JSONL, gzip, Parquet
and Arrow streams (the read step)."""
