"""Dedup step 4, per band partition: candidate pairs from equal band keys, confirmed by the
signatures' estimated Jaccard similarity.

Documents with an equal (band, key) are candidates: all pairs in a bucket of up to ``window + 1``
documents, each with the ``window`` before it in input order in a larger one. A pair is a
duplicate when the share of equal signature values, the estimated Jaccard similarity of their
shingle sets, is at least ``threshold``. Each document of a confirmed pair gets a fact: the largest
similarity among its confirmed pairs (the score the drop log reports). The edges are reduced to
stars in memory first (components.py: same components, fewer edges), then written both ways,
routed by their first node, for the first component step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from bloomline.io import read_json
from data_prep.config import DedupConfig
from data_prep.dedup.components import EDGE_SCHEMA, both_ways, components
from data_prep.dedup.exact import FACT_SCHEMA, chunk_runs, groups_of
from data_prep.dedup.keys import KEY_SCHEMA
from data_prep.dedup.shuffle import done, read_routed, route, write_routed
from data_prep.passes.budget import Budget
from data_prep.passes.chunks import chunk_table
from data_prep.storage.workdir import Paths

KEY_ROW_BYTES = 80
"""Bytes this step holds per band row: the three columns read (18), the sort permutation and the
sorted copies; measured peak over rows, rounded up."""
PAIR_BYTES = 48
"""Bytes per candidate pair: both refs, their sort and the similarity."""


def signatures(paths: Paths, nodes: np.ndarray, num_perm: int) -> np.ndarray:
    """Signatures of the documents ``nodes`` (sorted refs), read from their chunks' files one
    chunk at a time (memory-mapped: only the rows taken are read)."""
    out = np.empty((len(nodes), num_perm), dtype=np.uint32)
    for cid, s, e in chunk_runs(nodes):
        want = nodes[s:e] & 0xFFFFFFFF
        t = chunk_table(paths, cid, ["pos", "minhash"])
        pos = t.column("pos").to_numpy()
        order = np.argsort(pos)
        rows = order[np.searchsorted(pos, want, sorter=order)]
        assert np.array_equal(pos[rows], want), "a signature is missing from its chunk (a bug)"
        out[s:e] = t.column("minhash").take(pa.array(rows)).combine_chunks().flatten().to_numpy().reshape(-1, num_perm)
    return out


def candidates(band: np.ndarray, key: np.ndarray, ref: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct pairs (a, b), a < b, of documents in one (band, key) bucket, each document paired
    with up to ``window`` documents before it in input order."""
    o = np.lexsort((ref, key, band))
    band, key, ref = band[o], key[o], ref[o]
    gid = np.cumsum(groups_of(band, key)) - 1
    if not len(gid):
        return ref, ref
    size = np.bincount(gid)
    multi = size[gid] >= 2
    ref, gid = ref[multi], gid[multi]
    a, b = [], []
    for d in range(1, min(window, int(size.max()) - 1) + 1):
        same = gid[d:] == gid[:-d]
        a.append(ref[:-d][same])
        b.append(ref[d:][same])
    if not a:
        return ref[:0], ref[:0]
    a, b = np.concatenate(a), np.concatenate(b)
    o = np.lexsort((b, a))
    a, b = a[o], b[o]
    keep = groups_of(a, b)
    return a[keep], b[keep]


def max_by_node(nodes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(nodes, kind="stable")
    nodes, values = nodes[o], values[o]
    start = np.flatnonzero(groups_of(nodes))
    return nodes[start], (np.maximum.reduceat(values, start) if len(start) else values[:0])


def find_pairs(item: tuple[int, int], cfg: DedupConfig, out: str, memory_gib: float) -> dict[str, Any]:
    """Step 4 over band partition ``p`` (``rows`` rows over all chunks)."""
    p, rows = item
    paths = Paths.at(out)
    path = paths.dedup_file("pairs", p)
    if (m := done(path)) is not None:
        return m
    budget = Budget(memory_gib)
    budget.check(f"dedup band partition {p} ({rows:,} rows)", rows * KEY_ROW_BYTES, "raise memory_gib")
    plan = read_json(paths.dedup_plan)
    n = plan["partitions"]
    k = read_routed([paths.dedup_file("band-keys", r) for r in range(len(plan["ranges"]))], p, KEY_SCHEMA)
    a, b = candidates(k["band"], k["key"], k["ref"], cfg.window)
    del k
    budget.check(
        f"dedup band partition {p} ({len(a):,} candidate pairs)",
        len(a) * PAIR_BYTES + rows * KEY_ROW_BYTES,
        "raise memory_gib, or lower dedup.window",
    )
    nodes = np.unique(np.concatenate([a, b]))
    budget.check(
        f"dedup band partition {p} ({len(nodes):,} signatures)",
        len(nodes) * cfg.num_perm * 4 + len(a) * PAIR_BYTES,
        "raise memory_gib",
    )
    sigs = signatures(paths, nodes, cfg.num_perm)
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    sim = np.empty(len(a))
    step = 1 << 15  # pairs compared at once: a [step, num_perm] boolean temporary
    for s in range(0, len(a), step):
        sim[s : s + step] = (sigs[ia[s : s + step]] == sigs[ib[s : s + step]]).mean(axis=1)
    ok = sim >= cfg.threshold
    node, score = max_by_node(np.concatenate([a[ok], b[ok]]), np.concatenate([sim[ok], sim[ok]]))
    write_routed(
        paths.dedup_file("facts", p),
        FACT_SCHEMA,
        {"node": node, "exact": np.zeros(len(node), dtype=bool), "score": score},
        route(node, n),
        n,
    )
    u, v = both_ways(*components(b[ok], a[ok]))
    return write_routed(
        path, EDGE_SCHEMA, {"u": u, "v": v}, route(u, n), n, {"candidates": len(a), "confirmed": int(ok.sum())}
    )
