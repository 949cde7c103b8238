"""The dedup pass: the corpus-wide decision as a disk-backed Dask job (``driver.py``: keys → pairs →
stars → labels → decide) over the exact keys and MinHash signatures the chunks pass recorded
(data_prep/steps/minhash.py). A cluster of duplicates is a connected component of exact and
confirmed near pairs; its first document in input order is kept."""
