"""Dedup step 3, per range of chunks: the LSH band keys of every document that takes part in near
deduplication, routed to band partitions.

Rows ``(band, key, ref)``: one per band of each document that has a signature and is the first of
its exact key (exact.py; with exact dedup off, every document). A row goes to partition
``key mod P``: every row of a key meets in one partition, whatever chunk it came from.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from bloomline.io import read_json
from data_prep.config import DedupConfig
from data_prep.dedup.exact import later_in, range_chunks, refs_of
from data_prep.dedup.shuffle import done, write_routed
from data_prep.passes.chunks import chunk_table
from data_prep.steps.minhash import band_hashes
from data_prep.storage.workdir import Paths

KEY_SCHEMA = pa.schema([("band", pa.uint16()), ("key", pa.uint64()), ("ref", pa.int64())])


def band_keys(k: int, cfg: DedupConfig, out: str) -> dict[str, Any]:
    """The band-key rows of range ``k``'s chunks in ``partitions`` batches."""
    paths = Paths.at(out)
    path = paths.dedup_file("band-keys", k)
    if (m := done(path)) is not None:
        return m
    plan = read_json(paths.dedup_plan)
    b, n = plan["bands"], plan["partitions"]
    later = later_in(paths, plan, k) if cfg.exact else np.empty(0, dtype=np.int64)
    keys, refs = [], []
    for cid in range_chunks(plan, k):
        t = chunk_table(paths, cid, ["pos", "minhash"])
        ref = refs_of(cid, t.column("pos").to_numpy())
        mh = t.column("minhash").combine_chunks()
        take = ~np.asarray(mh.is_null().to_numpy(zero_copy_only=False), dtype=bool) & ~np.isin(ref, later)
        signed = int(take.sum())
        sigs = mh.filter(pa.array(take)).flatten().to_numpy().reshape(signed, cfg.num_perm)
        keys.append(band_hashes(sigs, b, plan["band_rows"]).ravel())  # row-major: each document's b bands in turn
        refs.append(np.repeat(ref[take], b))
    key, ref = np.concatenate(keys), np.concatenate(refs)
    cols = {"band": np.tile(np.arange(b, dtype=np.uint16), len(key) // max(b, 1)), "key": key, "ref": ref}
    return write_routed(
        path,
        KEY_SCHEMA,
        cols,
        (key % np.uint64(n)).astype(np.int64),
        n,
        {"signed": len(key) // max(b, 1), "chunks": len(keys)},
    )
