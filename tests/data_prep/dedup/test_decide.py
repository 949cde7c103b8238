"""A chunk's dedup decision (data_prep/dedup/decide.py decide_chunk): given the labels of its
duplicates, the drop log rows (reason, score, threshold, the kept document's id), the dropped
positions in input order, and per language what is kept (bytes and split draws), in the marker."""

import json

import numpy as np
import pyarrow.parquet as pq

from bloomline.config import from_dict
from data_prep.config import PrepareConfig
from data_prep.dedup.decide import decide_chunk
from data_prep.dedup.exact import refs_of
from data_prep.passes.chunks import process_chunk
from data_prep.storage.droplog import dropped_path
from data_prep.storage.workdir import Paths

EN = "Every morning the baker opens her shop before sunrise and arranges fresh loaves on the shelves while the street wakes."
FR = "Chaque matin la boulangère ouvre sa boutique avant le lever du soleil et range les pains frais sur les étagères."


def test_decide_chunk(tmp_path):
    src = tmp_path / "in.jsonl"
    docs = [("e1", EN, "en"), ("f1", FR, "fr"), ("e2", EN + " Again.", "en"), ("e3", EN, "en")]
    src.write_text("".join(json.dumps({"id": i, "text": t, "lang": lg}) + "\n" for i, t, lg in docs))
    cfg = from_dict(PrepareConfig, {"sources": [{"path": str(src)}], "langid": {"enabled": False}})
    out = tmp_path / "out"
    process_chunk({"id": 0, "path": str(src), "fmt": "jsonl", "size": 1}, cfg, str(out))
    # e3 (position 3) copies e1 exactly, e2 (position 2) is e1's near duplicate: labels sorted by node
    node, root = refs_of(0, np.array([2, 3])), refs_of(0, np.array([0, 0]))
    d = decide_chunk(
        0, cfg, Paths(out), node, root, np.array([False, True]), np.array([0.9, 1.0]), {int(root[0]): "e1"}
    )
    assert d["drops"] == [[2, "near"], [3, "exact"]]
    assert d["duplicates"] == {"en": {"near": 1, "exact": 1}}
    assert d["kept"]["en"]["bytes"] == len(EN.encode()) and d["kept"]["fr"]["bytes"] == len(FR.encode())
    rows = pq.read_table(dropped_path(out, "dedup", 0)).to_pylist()
    assert [(r["id"], r["reason"], r["score"], r["threshold"], r["duplicate_of"]) for r in rows] == [
        ("e2", "near", 0.9, cfg.dedup.threshold, "e1"),
        ("e3", "exact", 1.0, 1.0, "e1"),
    ]
    assert all(r["stage"] == "dedup" and r["outcome"] == "duplicates" for r in rows)
    assert json.loads(Paths(out).chunk_drops(0).read_text()) == d  # the chunk's marker
