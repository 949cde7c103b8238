"""Dedup steps 1–2: exact duplicates, as a group-by on the exact key partitioned by its hash.

* :func:`exact_keys`, per range of chunks: rows ``(key, ref)`` of every kept document, routed to
  partition ``key mod P``; ``ref = chunk << 32 | position`` names the document and orders
  documents as the input does.
* :func:`exact_groups`, per partition: the documents of one key form a group; every member after
  the first (in input order) is an exact duplicate. Its edge to the first goes to the component
  steps, its fact (``exact``, score 1) to the labels, and its ref, routed by chunk range, to the
  band keys step, which leaves it out: near-duplicate clustering runs over the first document of
  every exact group only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from bloomline.io import read_json
from data_prep.dedup.components import EDGE_SCHEMA, both_ways
from data_prep.dedup.shuffle import done, read_routed, route, write_routed
from data_prep.passes.budget import Budget
from data_prep.passes.chunks import chunk_table
from data_prep.storage.workdir import Paths

EXACT_SCHEMA = pa.schema([("key", pa.uint64()), ("ref", pa.int64())])
FACT_SCHEMA = pa.schema([("node", pa.int64()), ("exact", pa.bool_()), ("score", pa.float64())])
"""What the labels need to know of a duplicate: whether it is an exact one, and its score."""
LATER_SCHEMA = pa.schema([("ref", pa.int64())])
EXACT_ROW_BYTES = 64
"""Bytes this step holds per row: the two columns, the sort permutation, sorted copies, outputs."""


def refs_of(cid: int, pos: np.ndarray) -> np.ndarray:
    return (np.int64(cid) << np.int64(32)) | pos.astype(np.int64)


def chunk_runs(refs: np.ndarray) -> list[tuple[int, int, int]]:
    """``(chunk, start, end)`` of each run of one chunk's refs in sorted ``refs``."""
    if not len(refs):
        return []
    cids = refs >> 32
    bounds = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1], True])
    return [(int(cids[s]), int(s), int(e)) for s, e in zip(bounds[:-1], bounds[1:])]


def range_of(chunk: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Chunk range of each chunk id, ranges given by their first chunk ids (ascending)."""
    return np.searchsorted(starts, chunk, side="right") - 1


def range_starts(plan: dict[str, Any]) -> np.ndarray:
    return np.array([plan["chunks"][a] for a, _ in plan["ranges"]], dtype=np.int64)


def groups_of(*keys: np.ndarray) -> np.ndarray:
    """True where a run of equal ``keys`` (sorted rows) starts."""
    n = len(keys[0])
    start = np.zeros(n, dtype=bool)
    if n:
        start[0] = True
        for k in keys:
            start[1:] |= k[1:] != k[:-1]
    return start


def range_chunks(plan: dict[str, Any], k: int) -> list[int]:
    """The chunk ids of range ``k``."""
    a, b = plan["ranges"][k]
    return plan["chunks"][a:b]


def exact_keys(k: int, out: str) -> dict[str, Any]:
    """The exact-key rows of range ``k``'s chunks in ``partitions`` batches."""
    paths = Paths.at(out)
    path = paths.dedup_file("exact-keys", k)
    if (m := done(path)) is not None:
        return m
    plan = read_json(paths.dedup_plan)
    keys, refs = [], []
    for cid in range_chunks(plan, k):
        t = chunk_table(paths, cid, ["pos", "exact"])
        keys.append(t.column("exact").to_numpy())
        refs.append(refs_of(cid, t.column("pos").to_numpy()))
    key = np.concatenate(keys)
    n = plan["partitions"]
    return write_routed(
        path,
        EXACT_SCHEMA,
        {"key": key, "ref": np.concatenate(refs)},
        (key % np.uint64(n)).astype(np.int64),
        n,
        {"chunks": len(keys)},
    )


def exact_groups(item: tuple[int, int], out: str, memory_gib: float) -> dict[str, Any]:
    """Exact groups of key partition ``p`` (``rows`` rows over all chunks)."""
    p, rows = item
    paths = Paths.at(out)
    path = paths.dedup_file("exact", p)
    if (m := done(path)) is not None:
        return m
    Budget(memory_gib).check(
        f"dedup exact partition {p} ({rows:,} documents)", rows * EXACT_ROW_BYTES, "raise memory_gib"
    )
    plan = read_json(paths.dedup_plan)
    n = plan["partitions"]
    k = read_routed([paths.dedup_file("exact-keys", r) for r in range(len(plan["ranges"]))], p, EXACT_SCHEMA)
    o = np.lexsort((k["ref"], k["key"]))
    key, ref = k["key"][o], k["ref"][o]
    first = groups_of(key)
    later, parent = ref[~first], ref[first][np.cumsum(first) - 1][~first]
    write_routed(
        paths.dedup_file("exact-later", p),
        LATER_SCHEMA,
        {"ref": later},
        range_of(later >> 32, range_starts(plan)),
        len(plan["ranges"]),
    )
    write_routed(
        paths.dedup_file("exact-facts", p),
        FACT_SCHEMA,
        {"node": later, "exact": np.ones(len(later), dtype=bool), "score": np.ones(len(later))},
        route(later, n),
        n,
    )
    u, v = both_ways(later, parent)
    return write_routed(path, EDGE_SCHEMA, {"u": u, "v": v}, route(u, n), n, {"duplicates": len(later)})


def later_in(paths: Paths, plan: dict[str, Any], k: int) -> np.ndarray:
    """Refs of range ``k``'s documents that are not the first of their exact key (sorted)."""
    return np.sort(
        read_routed([paths.dedup_file("exact-later", p) for p in range(plan["partitions"])], k, LATER_SCHEMA)["ref"]
    )
