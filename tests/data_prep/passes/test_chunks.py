"""The chunks pass's contract (data_prep/passes/chunks.py), on one real chunk of JSONL: the recipe's steps
run in order, the kept documents land sorted by (language, position) in an Arrow file with their
dedup keys and sizes, the drop log and the scores are written before the marker, and a chunk with
a marker is not processed again."""

import json

import pyarrow.parquet as pq

from bloomline.config import from_dict
from data_prep.config import PrepareConfig
from data_prep.passes.chunks import CHUNK_SCHEMA, chunk_steps, chunk_table, process_chunk
from data_prep.storage.droplog import dropped_path, scores_path
from data_prep.storage.workdir import Paths

GOOD = {
    "en": "Every morning the baker opens her shop before sunrise and arranges fresh loaves on the shelves while the street wakes.",
    "fr": "Chaque matin la boulangère ouvre sa boutique avant le lever du soleil et range les pains frais sur les étagères.",
}


def test_one_chunk(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [
        {"id": "f1", "text": GOOD["fr"], "lang": "fr"},
        {"id": "e1", "text": GOOD["en"], "lang": "en"},
        {"id": "short", "text": "Too few words.", "lang": "en"},  # too_few_words
        {"id": "e2", "text": GOOD["en"].replace("baker", "miller"), "lang": "en"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = from_dict(PrepareConfig, {"sources": [{"path": str(src)}], "langid": {"enabled": False}})
    out = tmp_path / "out"
    paths = Paths(out)
    # the recipe decides the steps: language ID off here, no decontamination tasks
    assert [name for name, _ in chunk_steps(cfg, paths)] == ["normalize", "quality", "dedup_sign"]
    chunk = {"id": 0, "path": str(src), "fmt": "jsonl", "size": src.stat().st_size}
    summary = process_chunk(chunk, cfg, str(out))
    assert summary["docs"] == 3 and list(summary["steps"]) == ["read", "normalize", "quality", "dedup_sign"]
    assert summary["ledger"]["en"]["filtered"] == {"too_few_words": 1}
    t = chunk_table(paths, 0, [f.name for f in CHUNK_SCHEMA])
    assert t.schema == CHUNK_SCHEMA
    assert t.column("id").to_pylist() == ["e1", "e2", "f1"]  # by (lang, pos)
    assert summary["lang_ranges"] == {"en": [0, 2], "fr": [2, 3]}
    assert t.column("nbytes").to_pylist() == [len(s.encode()) for s in t.column("text").to_pylist()]
    assert len(set(t.column("exact").to_pylist())) == 3 and all(t.column("minhash").to_pylist())
    assert [r["id"] for r in pq.read_table(dropped_path(out, "chunk", 0)).to_pylist()] == ["short"]
    assert len(pq.read_table(scores_path(out, 0))) == 4  # every document the quality step checked
    # done: the marker's summary comes back, nothing is processed again
    src.write_text("")
    assert process_chunk(chunk, cfg, str(out)) == summary


def test_the_drop_log_is_in_input_order(tmp_path):
    """The quality step scores a batch of documents at once, after the language check has
    dropped its share of the same documents: the drop log still lists every drop (read errors
    included) in the order of the input."""
    src = tmp_path / "in.jsonl"
    lines = [
        "{not json",  # read error
        json.dumps({"id": "short", "text": "Too few words.", "lang": "en"}),  # quality
        json.dumps({"id": "fr-as-en", "text": GOOD["fr"] + " " + GOOD["fr"], "lang": "en"}),  # language ID
        "[1, 2]",  # read error
        json.dumps({"id": "e1", "text": GOOD["en"], "lang": "en"}),
        json.dumps({"id": "short2", "text": "Also too few.", "lang": "en"}),  # quality
    ]
    src.write_text("".join(x + "\n" for x in lines))
    cfg = from_dict(PrepareConfig, {"sources": [{"path": str(src)}]})
    out = tmp_path / "out"
    process_chunk({"id": 0, "path": str(src), "fmt": "jsonl", "size": src.stat().st_size}, cfg, str(out))
    rows = pq.read_table(dropped_path(out, "chunk", 0)).to_pylist()
    assert [(r["stage"], r["source"].rsplit(":", 1)[1]) for r in rows] == [
        ("read", "1"),
        ("quality", "2"),
        ("langid", "3"),
        ("read", "4"),
        ("quality", "6"),
    ]
