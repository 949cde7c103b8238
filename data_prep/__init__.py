"""Data preparation: raw multilingual corpora → length-bucketed Arrow shards + manifest.

Stages (one step = one class with ``run()`` over documents, stats per step):
read → normalize → language check → quality filters → dedup → PII → tokenizer → tokenize →
pack → write. See ``data_prep/FORMAT.md`` for the output contract.
"""
