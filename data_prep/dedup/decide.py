"""Dedup steps 6 and 7: every duplicate's label (the kept document of its component, its reason
and score), then per chunk the decision files and the drop log.

* :func:`label_nodes`, per component partition: the converged stars give each non-smallest node
  its component's smallest node (the document kept); the facts say why it goes — ``exact`` when
  an earlier document has its exact key, else ``near`` with the largest similarity among its
  confirmed pairs. Labels are routed by the chunk range of the node.
* :func:`decide_range`, per range of consecutive chunks: for each chunk, the drop log rows
  (``DIR/dropped/dedup-cNNNNNN.parquet``, input order) and ``.work/dedup/cNNNNNN.json`` — the
  dropped positions, and per language the kept documents, bytes and split draws
  (data_prep/passes/split.py) — written last, as the chunk's marker.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from bloomline.io import read_json, write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.dedup.components import EDGE_ROW_BYTES, EDGE_SCHEMA
from data_prep.dedup.exact import FACT_SCHEMA, chunk_runs, groups_of, range_of, range_starts
from data_prep.dedup.shuffle import done, read_routed, write_routed
from data_prep.passes.budget import Budget
from data_prep.passes.chunks import chunk_table
from data_prep.passes.split import SplitDraws
from data_prep.storage.droplog import DROP_SCHEMA, dropped_path, write_rows
from data_prep.storage.workdir import Paths

LABEL_SCHEMA = pa.schema([("node", pa.int64()), ("root", pa.int64()), ("exact", pa.bool_()), ("score", pa.float64())])
LABEL_ROW_BYTES = 96
"""Bytes a decide task holds per label row: the columns, a sort and the kept documents' ids."""


def label_nodes(
    item: tuple[int, int], out: str, stars: list[str], memory_gib: float, facts: list[str]
) -> dict[str, Any]:
    """Labels of component partition ``q`` from batch q of the ``stars`` files (relative to the
    folder: each process has its own copy of a folder at a URL) and the ``facts`` files
    (``exact-facts``, ``facts``)."""
    q, rows = item
    paths = Paths.at(out)
    path = paths.dedup_file("labels", q)
    if (m := done(path)) is not None:
        return m
    plan = read_json(paths.dedup_plan)
    n = plan["partitions"]
    Budget(memory_gib).check(f"dedup labels, partition {q} ({rows:,} edges)", rows * EDGE_ROW_BYTES, "raise memory_gib")
    e = read_routed([paths.out / f for f in stars], q, EDGE_SCHEMA)
    child = e["u"] > e["v"]
    node, root = e["u"][child], e["v"][child]
    o = np.argsort(node)
    node, root = node[o], root[o]
    assert not len(node) or np.all(node[1:] != node[:-1]), "a node with two roots: the stars did not converge (a bug)"
    f = read_routed([paths.dedup_file(kind, i) for kind in facts for i in range(n)], q, FACT_SCHEMA)
    o = np.lexsort((-f["score"], ~f["exact"], f["node"]))  # per node: exact first, then the largest score
    fn, fe, fs = f["node"][o], f["exact"][o], f["score"][o]
    first = groups_of(fn)
    fn, fe, fs = fn[first], fe[first], fs[first]
    at = np.searchsorted(fn, node)
    assert np.all(at < len(fn)) and np.array_equal(fn[at], node), "a duplicate without facts (a bug)"
    return write_routed(
        path,
        LABEL_SCHEMA,
        {"node": node, "root": root, "exact": fe[at], "score": fs[at]},
        range_of(node >> 32, range_starts(plan)),
        len(plan["ranges"]),
    )


def ids_of(paths: Paths, refs: np.ndarray) -> dict[int, str]:
    """The document id of each ref (sorted), one chunk's ids at a time."""
    ids: dict[int, str] = {}
    for cid, s, e in chunk_runs(refs):
        t = chunk_table(paths, cid, ["pos", "id"])
        pos = t.column("pos").to_numpy()
        base = cid << 32
        for i in np.flatnonzero(np.isin(pos, refs[s:e] & 0xFFFFFFFF)).tolist():
            ids[base | int(pos[i])] = t.column("id")[i].as_py()
    return ids


def decide_chunk(
    cid: int,
    cfg: PrepareConfig,
    paths: Paths,
    node: np.ndarray,
    root: np.ndarray,
    exact: np.ndarray,
    score: np.ndarray,
    root_ids: dict[int, str],
) -> dict[str, Any]:
    """Chunk ``cid``'s decision, given the labels of its duplicates (sorted by node)."""
    t = chunk_table(paths, cid, ["pos", "id", "loc", "lang", "text", "valid_draw", "nbytes"])
    pos = t.column("pos").to_numpy()
    langs = np.array(t.column("lang").to_pylist(), dtype=object)
    dropped = np.isin(pos, node & 0xFFFFFFFF)
    rows_out, drops, duplicates = [], [], {}
    at = np.flatnonzero(dropped)
    at = at[np.argsort(pos[at])]  # input order
    label = np.searchsorted(node & 0xFFFFFFFF, pos[at])
    for i, j in zip(at.tolist(), label.tolist()):
        kind = "exact" if exact[j] else "near"
        lang = langs[i]
        drops.append([int(pos[i]), kind])
        duplicates.setdefault(lang, {}).setdefault(kind, 0)
        duplicates[lang][kind] += 1
        text = t.column("text")[i].as_py()
        rows_out.append(
            {
                "id": t.column("id")[i].as_py(),
                "source": t.column("loc")[i].as_py(),
                "lang": lang,
                "stage": "dedup",
                "outcome": "duplicates",
                "reason": kind,
                "score": float(score[j]),
                "threshold": 1.0 if kind == "exact" else cfg.dedup.threshold,
                "duplicate_of": root_ids[int(root[j])],
                "text": text[: cfg.dropped_text_chars] if cfg.dropped_text_chars else None,
            }
        )
    write_rows(dropped_path(paths.out, "dedup", cid), rows_out, DROP_SCHEMA)
    draw = t.column("valid_draw").to_numpy()
    nbytes = t.column("nbytes").to_numpy()
    kept: dict[str, Any] = {}
    for lang in sorted(set(langs.tolist())):
        sel = (langs == lang) & ~dropped
        if sel.any():
            d = SplitDraws.of(draw[sel], cfg.pack.valid_fraction, cfg.pack.valid_min_docs)
            kept[lang] = {"bytes": int(nbytes[sel].sum()), "draws": d.to_dict()}
    result = {"id": cid, "drops": drops, "kept": kept, "duplicates": duplicates}
    write_json_atomic(paths.chunk_drops(cid), result, durable=False)
    return result


def decide_range(item: tuple[int, int], cfg: PrepareConfig, out: str, memory_gib: float) -> list[dict[str, Any]]:
    """Decide every chunk of range ``k`` (``rows`` labels); chunks already decided are read back.
    Returns each chunk's summary without its dropped positions: the driver gets no list of documents."""
    k, rows = item
    paths = Paths.at(out)
    plan = read_json(paths.dedup_plan)
    a, b = plan["ranges"][k]
    cids = plan["chunks"][a:b]
    if all(paths.chunk_drops(c).exists() for c in cids):
        return [summary(read_json(paths.chunk_drops(c))) for c in cids]
    Budget(memory_gib).check(
        f"dedup decisions of chunks {cids[0]}–{cids[-1]} ({rows:,} duplicates)",
        rows * LABEL_ROW_BYTES,
        "raise memory_gib",
    )
    files = [paths.dedup_file("labels", q) for q in range(plan["partitions"])] if plan["enabled"] else []
    lab = read_routed(files, k, LABEL_SCHEMA)
    o = np.argsort(lab["node"])
    node, root, exact, score = (lab[c][o] for c in ("node", "root", "exact", "score"))
    root_ids = ids_of(paths, np.unique(root))
    out_ = []
    for cid in cids:
        if paths.chunk_drops(cid).exists():
            out_.append(summary(read_json(paths.chunk_drops(cid))))
            continue
        lo, hi = np.searchsorted(node >> 32, [cid, cid + 1])
        out_.append(
            summary(decide_chunk(cid, cfg, paths, node[lo:hi], root[lo:hi], exact[lo:hi], score[lo:hi], root_ids))
        )
    return out_


def summary(decision: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in decision.items() if k != "drops"}
