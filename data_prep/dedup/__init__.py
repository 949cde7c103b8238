"""Deduplication of the whole corpus: exact keys and MinHash LSH on the per-document side
(``signature.py``, part of the chunk stage), and the corpus-wide decision as a disk-backed Dask job
(``stage.py``: keys → pairs → stars → labels → decide). A cluster of duplicates is a connected
component of exact and confirmed near pairs; its first document in input order is kept."""
