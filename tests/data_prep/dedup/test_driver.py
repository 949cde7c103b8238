"""The dedup job through the prepare stages (serial map): what a cluster of duplicates is, and
outputs that do not depend on partitions or on where a run was interrupted."""

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bloomline.config import load_config
from data_prep.config import DedupConfig, PrepareConfig, SourceConfig
from data_prep.dedup import driver
from data_prep.pipeline import run_all, serial_map
from data_prep.steps.minhash import minhash
from data_prep.storage.droplog import check_dropped
from tests.support.prepare_runs import tree_bytes

REPO = Path(__file__).resolve().parents[3]


def demo_cfg(*overrides) -> PrepareConfig:
    return load_config(PrepareConfig, REPO / "configs/data/demo.yaml", list(overrides))


def words(n: int, tag: str) -> list[str]:
    rng = random.Random(tag)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(n)]


def estimated(a: str, b: str, cfg: DedupConfig) -> float:
    return float(np.mean(minhash(a, cfg, False) == minhash(b, cfg, False)))


def test_a_cluster_is_a_component_and_its_first_document_is_kept(tmp_path):
    """A~B and B~C but A≁C: A, B and C are one component, so B and C both go as duplicates of A
    (deciding one document at a time against the kept ones would have kept C). D, an exact copy
    of C, goes as exact, also naming A: the kept document of its cluster."""
    cfg = DedupConfig(num_perm=256)
    w, extra = words(300, "base"), words(40, "extra")
    a = " ".join(w)
    b = " ".join(w[20:] + extra[:20])
    c = " ".join(w[40:] + extra[:40])
    assert estimated(a, b, cfg) >= 0.8 and estimated(b, c, cfg) >= 0.8 and estimated(a, c, cfg) < 0.8  # the premise
    docs = [("A", a), ("other", " ".join(words(300, "other"))), ("B", b), ("C", c), ("D", c.upper() + "!")]
    src = tmp_path / "chain.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t, "lang": "en"}) + "\n" for i, t in docs))
    pcfg = demo_cfg(
        "dedup.num_perm=256",
        "pack.valid_min_docs=0",
        "pack.valid_fraction=0.0",
        "tokenizer.vocab_size=300",
        "filters.enabled=false",
        "langid.enabled=false",
    )
    pcfg.sources = [SourceConfig(path=str(src))]
    m = run_all(pcfg, tmp_path / "out")
    assert m["languages"]["en"]["duplicates"] == {"exact": 1, "near": 2} and m["languages"]["en"]["docs_kept"] == 2
    log = pq.read_table(tmp_path / "out" / "dropped" / "dedup-c000000.parquet").to_pylist()
    assert [(r["id"], r["reason"], r["duplicate_of"]) for r in log] == [
        ("B", "near", "A"),
        ("C", "near", "A"),
        ("D", "exact", "A"),
    ]
    # the score is the strongest confirmed similarity that joined the document to its cluster
    assert log[0]["score"] == max(estimated(a, b, cfg), estimated(b, c, cfg)) and log[1]["score"] == estimated(
        b, c, cfg
    )
    assert log[2]["score"] == 1.0 and [r["threshold"] for r in log] == [0.8, 0.8, 1.0]
    assert not check_dropped(tmp_path / "out", m["languages"])


@pytest.fixture(scope="module")
def dups(tmp_path_factory, dup_inputs) -> tuple[Path, Path]:
    """The dup corpus (tests/conftest.py) prepared once, with the job's default partitioning (one band partition)."""
    root = tmp_path_factory.mktemp("dups")
    src = dup_inputs
    cfg = demo_cfg("keep_work=true")
    cfg.sources = [SourceConfig(path=str(src))]
    m = run_all(cfg, root / "ref")
    assert m["stages"]["dedup"]["duplicates"]["near"] > 50 and m["stages"]["dedup"]["duplicates"]["exact"] > 50
    return src, root / "ref"


def test_the_output_does_not_depend_on_the_partitions(dups, tmp_path, monkeypatch):
    src, ref = dups
    monkeypatch.setattr(driver, "ROWS_PER_TASK", 500)  # → dozens of band and node partitions
    monkeypatch.setattr(driver, "DOCS_PER_RANGE", 40)  # → a decide task per few chunks
    cfg = demo_cfg("keep_work=true")
    cfg.sources = [SourceConfig(path=str(src))]
    run_all(cfg, tmp_path / "out")
    plan = json.loads((tmp_path / "out" / ".work" / "dedup" / "plan.json").read_text())
    assert plan["partitions"] >= 16 and len(plan["ranges"]) > 3
    assert tree_bytes(tmp_path / "out") == tree_bytes(ref)


class Crash(Exception):
    pass


@pytest.mark.parametrize(
    "task,after",
    [
        ("exact_keys", 3),
        ("exact_groups", 4),
        ("band_keys", 4),
        ("find_pairs", 5),
        ("star_step", 9),
        ("label_nodes", 2),
        ("decide_range", 4),
    ],
)
def test_an_interrupted_dedup_resumes_to_the_same_bytes(dups, tmp_path, monkeypatch, task, after):
    """The job dies after ``after`` tasks of one step (the rest of that step never ran); the rerun
    finishes from the files on disk to the uninterrupted output."""
    src, ref = dups
    monkeypatch.setattr(driver, "ROWS_PER_TASK", 500)
    monkeypatch.setattr(driver, "DOCS_PER_RANGE", 40)
    cfg = demo_cfg("keep_work=true")
    cfg.sources = [SourceConfig(path=str(src))]
    seen = {"n": 0}

    def dying_map(func, items):
        for x in items:
            if getattr(func, "func", func).__name__ == task:
                seen["n"] += 1
                if seen["n"] > after:
                    raise Crash(task)
            yield func(x)

    with pytest.raises(Crash):
        run_all(cfg, tmp_path / "out", map_fn=dying_map)
    assert (tmp_path / "out" / ".work" / "dedup").is_dir() and not (tmp_path / "out" / ".work" / "dedup.json").exists()
    run_all(cfg, tmp_path / "out", map_fn=serial_map)
    assert tree_bytes(tmp_path / "out") == tree_bytes(ref)
