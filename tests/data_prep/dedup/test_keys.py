"""The band keys of a range of chunks (data_prep/dedup/keys.py band_keys): one row per band of
every signed document that is the first of its exact key, each routed to partition key mod P,
the key the band hash of its signature (the same bands meet in the same partition)."""

import json

import numpy as np

from bloomline.config import from_dict
from bloomline.io import write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.dedup.exact import LATER_SCHEMA, refs_of
from data_prep.dedup.keys import KEY_SCHEMA, band_keys
from data_prep.dedup.shuffle import read_routed, write_routed
from data_prep.passes.chunks import chunk_table, process_chunk
from data_prep.steps.minhash import band_hashes
from data_prep.storage.workdir import Paths

EN = "Every morning the baker opens her shop before sunrise and arranges fresh loaves on the shelves while the street wakes."
FR = "Chaque matin la boulangère ouvre sa boutique avant le lever du soleil et range les pains frais sur les étagères."


def test_band_keys(tmp_path):
    src = tmp_path / "in.jsonl"
    docs = [("e1", EN, "en"), ("f1", FR, "fr"), ("e3", EN, "en")]
    src.write_text("".join(json.dumps({"id": i, "text": t, "lang": lg}) + "\n" for i, t, lg in docs))
    cfg = from_dict(PrepareConfig, {"sources": [{"path": str(src)}], "langid": {"enabled": False}})
    out, paths = tmp_path / "out", Paths(tmp_path / "out")
    process_chunk({"id": 0, "path": str(src), "fmt": "jsonl", "size": 1}, cfg, str(out))
    bands, rows, parts = 4, cfg.dedup.num_perm // 4, 3
    write_json_atomic(
        paths.dedup_plan, {"bands": bands, "band_rows": rows, "partitions": parts, "chunks": [0], "ranges": [[0, 1]]}
    )
    later = refs_of(0, np.array([2]))  # e3 (position 2) is a later copy of e1's exact key
    for p in range(parts):  # the exact step's files: range 0's later refs, in partition 0's file only
        write_routed(
            paths.dedup_file("exact-later", p),
            LATER_SCHEMA,
            {"ref": later if p == 0 else later[:0]},
            np.zeros(1 if p == 0 else 0, dtype=np.int64),
            1,
        )
    report = band_keys(0, cfg.dedup, str(out))
    assert report["signed"] == 2 and sum(report["rows"]) == 2 * bands
    got = [read_routed([paths.dedup_file("band-keys", 0)], p, KEY_SCHEMA) for p in range(parts)]
    assert all((g["key"] % np.uint64(parts) == p).all() for p, g in enumerate(got))  # routed by key
    t = chunk_table(paths, 0, ["pos", "minhash"])
    sigs = np.array(t.column("minhash").to_pylist(), dtype=np.uint32)
    want = {
        (b, int(k), int(refs_of(0, np.array([pos]))[0]))
        for pos in (0, 1)  # e1 and f1 (kept in (lang, pos) order: en rows first)
        for b, k in enumerate(
            band_hashes(sigs[[int(x) for x in t.column("pos").to_pylist()].index(pos)][None], bands, rows)[0]
        )
    }
    assert {(int(b), int(k), int(r)) for g in got for b, k, r in zip(g["band"], g["key"], g["ref"])} == want
