"""bloomline's deduplication against datatrove's MinHash on the same corpus: which documents each
removes, and why they differ (tests/bench/test_dedup_agreement.py asserts that every difference
has a reason; ``python -m bench.dedup_agreement INPUT_DIR`` prints the report).

Both sides see the same JSONL files in the same order with the same shape of LSH: 5-word
shingles, 9 bands of 13 hashes (bloomline's choice for threshold 0.8 and 128 values).
bloomline's quality and language filters are off, so both deduplicate every document. Each
document removed by one side only falls in one of these classes, decided from the documents'
exact Jaccard similarity on bloomline's shingles (FORMAT.md, "Duplicates"):

* ``other member kept``: a duplicate on both sides, of the same cluster; bloomline keeps the
  cluster's first document, datatrove the root of its union-by-size.
* ``not confirmed``: removed by datatrove only, below the threshold against every other member
  of its datatrove cluster: datatrove takes every LSH band collision as a duplicate, bloomline
  checks the pair's estimated similarity.
* ``near the threshold``: similarity within 0.15 of the threshold to the cluster it joined on
  one side: at 9 × 13 bands a pair is a candidate with probability 0.40 at J = 0.8, 0.69 at 0.85
  and 0.93 at 0.9, so two hash families find different pairs, and MinHash estimates differ.
* ``Chinese``: bloomline shingles Han text by characters, datatrove by its English word tokenizer.
* anything else is ``unexplained``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

from tests.support import REPO

MARGIN = 0.15


def datatrove_removed(src: Path, out: Path) -> tuple[set[str], dict[str, str]]:
    """Ids datatrove's four MinHash stages remove, and each clustered id's cluster (an id)."""
    import numpy as np
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.io import get_datafolder
    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader

    shutil.rmtree(out, ignore_errors=True)
    cfg = MinhashConfig(n_grams=5, num_buckets=9, hashes_per_bucket=13)
    stages = [  # one reading task: document indices are positions in the whole input
        ([JsonlReader(str(src), glob_pattern="**/*.jsonl"), MinhashDedupSignature(str(out / "sigs"), config=cfg)], 1),
        ([MinhashDedupBuckets(str(out / "sigs"), str(out / "buckets"), config=cfg)], cfg.num_buckets),
        ([MinhashDedupCluster(str(out / "buckets"), str(out / "remove"), config=cfg, save_cluster_id=True)], 1),
    ]
    for i, (pipeline, tasks) in enumerate(stages):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(out / "logs" / str(i))).run()
    ids = [
        json.loads(line)["id"]
        for f in get_datafolder(str(src)).list_files(glob_pattern="**/*.jsonl", recursive=True)
        for line in (src / f).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    removed = {ids[i] for i in np.fromfile(out / "remove" / "000000.remove", dtype="<u4").tolist()}
    pairs = np.fromfile(out / "remove" / "000000.clusters", dtype="<u4").reshape(-1, 2)
    return removed, {ids[a]: str(b) for a, b in pairs.tolist()}


def bloomline_removed(src: Path, out: Path) -> tuple[set[str], dict[str, str]]:
    """Ids bloomline's dedup pass removes, and each clustered id's cluster (the kept id)."""
    import pyarrow.parquet as pq

    from bloomline.config import load_config
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import run_all

    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", ["filters.enabled=false", "langid.enabled=false"])
    cfg.sources = [SourceConfig(path=str(src))]
    run_all(cfg, out)
    rows = [r for f in sorted((out / "dropped").glob("dedup-*.parquet")) for r in pq.read_table(f).to_pylist()]
    cluster = {r["id"]: r["duplicate_of"] for r in rows}
    cluster.update({kept: kept for kept in set(cluster.values())})
    return {r["id"] for r in rows}, cluster


def compare(src: Path, workdir: Path) -> dict:
    from data_prep.steps.minhash import shingles
    from data_prep.steps.normalize import normalize_text

    ours, our_cluster = bloomline_removed(src, workdir / "bloomline")
    theirs, their_cluster = datatrove_removed(src, workdir / "datatrove")
    docs = {}
    for f in sorted(src.rglob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            docs[r["id"]] = (normalize_text(r["text"]), r["lang"])

    def members(cluster: dict[str, str]) -> dict[str, set[str]]:
        by: dict[str, set[str]] = {}
        for doc, c in cluster.items():
            by.setdefault(c, set()).add(doc)
        return {doc: by[c] for doc, c in cluster.items()}

    def jaccard(a: str, b: str) -> float:
        sa, sb = (shingles(docs[x][0], 5, docs[x][1].startswith("zh")) for x in (a, b))
        return len(sa & sb) / len(sa | sb) if sa | sb else 1.0

    mine, yours = members(our_cluster), members(their_cluster)
    classes: Counter = Counter()
    unexplained = []
    for doc in sorted(ours ^ theirs):
        side = yours if doc in theirs else mine
        best = max((jaccard(doc, m) for m in side[doc] - {doc}), default=0.0)
        if doc in mine and doc in yours and len(mine[doc]) > 1 and len(yours[doc]) > 1:
            why = "other member kept"
        elif docs[doc][1].startswith("zh"):
            why = "Chinese"
        elif doc in theirs and best < 0.8:
            why = "not confirmed"
        elif abs(best - 0.8) <= MARGIN:
            why = "near the threshold"
        else:
            why = "unexplained"
            unexplained.append((doc, "datatrove" if doc in theirs else "bloomline", round(best, 3)))
        classes[(why, "datatrove only" if doc in theirs else "bloomline only")] += 1
    return {
        "documents": len(docs),
        "bloomline": len(ours),
        "datatrove": len(theirs),
        "both": len(ours & theirs),
        "classes": dict(classes),
        "unexplained": unexplained,
    }
