"""Small synthetic prepared data: shards written by ShardWriter under the pack pass's names, in
buckets of 128, 256 and 512 tokens, for three languages of different sizes, with a manifest as
FORMAT.md says (:func:`write_prepared`), and the batch settings the sampler's tests draw it with
(``BATCH``). For the tests of the dynamic-batch sampler (tests/training/data/test_sampler.py), of
the blend rules and of the benchmarks' fixed-batch baseline."""

from __future__ import annotations

import json

import numpy as np

from data_prep.passes.best_fit import Sample
from data_prep.storage.shards import ShardWriter
from data_prep.storage.workdir import shard_path
from training.config import BatchConfig

BUCKETS = [128, 256, 512]
VOCAB, EOS, PAD = 1000, 2, 3
# rows per (language, bucket): languages of different sizes, most rows in the largest bucket
ROWS = {"aa": {128: 200, 256: 150, 512: 400}, "bb": {128: 100, 256: 80, 512: 200}, "cc": {128: 50, 256: 40, 512: 100}}
BLEND = {"aa": 0.5, "bb": 0.3, "cc": 0.2}
BATCH = BatchConfig(tokens_per_step=16384, micro_batch_tokens=2048)


def realistic_lengths(rng, n, lo, hi):
    """Like the packer's output: most samples nearly fill the bucket, some are short tails."""
    full = rng.integers(max(lo, int(0.95 * hi)), hi + 1, size=n)
    short = rng.integers(lo, hi + 1, size=n)
    return np.where(rng.random(n) < 0.8, full, short)


def make_sample(rng, bucket, n):
    ids = rng.integers(4, VOCAB, size=n).astype(np.int32)
    cuts = sorted(set(rng.integers(1, n, size=int(rng.integers(0, 4))).tolist())) if n > 1 else []
    offsets = [0] + cuts
    for end in cuts + [n]:
        ids[end - 1] = EOS  # every document ends with </s>
    return Sample(bucket, ids, offsets)


def write_prepared(root, rows=ROWS, blend=BLEND, seed=0, vocab=VOCAB):
    """Shards written by ShardWriter + a manifest with the fields load_manifest checks."""
    rng = np.random.default_rng(seed)
    shards = []
    for lang, per_bucket in rows.items():
        prev = 0
        for bucket in BUCKETS:
            n = per_bucket[bucket]
            # two shards per stream when large, as prepare writes parts
            parts = [n // 2, n - n // 2] if n >= 200 else [n]
            for p, count in enumerate(parts):
                rel = shard_path("train", lang, bucket, p)
                w = ShardWriter(root / rel, lang, bucket, "train")
                for ln in realistic_lengths(rng, count, prev + 1, bucket):
                    w.add(make_sample(rng, bucket, int(ln)))
                shards.append({"path": rel, "split": "train", "bucket": bucket, "lang": lang, **w.close()})
            prev = bucket
    manifest = {
        "format_version": 1,
        "tokenizer": {
            "path": "tokenizer/tokenizer.model",
            "vocab_size": vocab,
            "sha256": "0" * 64,
            "trained": True,
            "eos_id": EOS,
            "pad_id": PAD,
            "bos_id": 1,
            "unk_id": 0,
        },
        "buckets": BUCKETS,
        "seq_len": BUCKETS[-1],
        "shards": sorted(shards, key=lambda s: s["path"]),
        "blend": blend,
        "languages": {
            lg: {"train_tokens": sum(s["tokens"] for s in shards if s["lang"] == lg), "name": lg} for lg in rows
        },
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root
