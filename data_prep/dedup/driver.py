"""The dedup job: exact and near duplicates of the whole corpus, as Dask tasks over files on disk.

Steps, each a map whose tasks read batch i of the files of the step before (shuffle.py):

===========  ===================================================  ===============================
step          per                                                   files (under .work/dedup/)
===========  ===================================================  ===============================
exact keys    chunk: exact key of every document, by key            ``exact-keys/``
exact         key partition: exact groups; later members go          ``exact/``, ``exact-facts/``,
                                                                     ``exact-later/``
band keys     chunk: LSH band keys of the first of each exact       ``band-keys/``
              group, by key
pairs         key partition: candidates, confirmed pairs, facts     ``pairs/``, ``facts/``
stars         node partition, rounds of Large-/Small-Star until     ``stars/``
              every component is a star around its first document
labels        node partition: kept document, reason, score          ``labels/``
decide        chunk range: drop log, dropped positions, kept stats  ``cNNNNNN.json``
===========  ===================================================  ===============================

The driver only counts rows per partition and merges per-language summaries; no task holds more
than its partition, sized from ``memory_gib`` (data_prep/passes/budget.py). Every file is written
atomically with a marker, so a killed run resumes; every decision is a function of the data
alone (components labelled by their smallest ref), so the output is byte-identical for any
number of workers and partitions. Semantics in data_prep/FORMAT.md ("Duplicates").
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Iterable

from bloomline.io import read_json, write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.dedup.components import EDGE_ROW_BYTES, run_stars
from data_prep.dedup.decide import LABEL_ROW_BYTES, decide_range, label_nodes
from data_prep.dedup.exact import exact_groups, exact_keys
from data_prep.dedup.keys import band_keys
from data_prep.dedup.pairs import KEY_ROW_BYTES, find_pairs
from data_prep.passes.budget import Budget
from data_prep.passes.pack import plan_parts
from data_prep.passes.split import SplitDraws, validation_rules
from data_prep.steps.minhash import band_params
from data_prep.storage.workdir import Paths

MapFn = Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]]

ROWS_PER_TASK = 1 << 20
"""At most this many key rows per band partition (~100 MB at its peak), whatever the budget: tasks
small enough to spread over the workers, and a peak that does not grow with the corpus."""
DOCS_PER_RANGE = 1 << 15
"""At most this many documents per decide task (whole chunks: a range may hold one larger chunk)."""


def make_plan(cfg: PrepareConfig, paths: Paths, chunk_ids: list[int], docs: dict[int, int]) -> dict[str, Any]:
    """Partitions and chunk ranges for this corpus (``.work/dedup/plan.json``, kept on resume)."""
    if paths.dedup_plan.exists():
        return read_json(paths.dedup_plan)
    d = cfg.dedup
    bands, band_rows = band_params(d.threshold, d.num_perm) if d.near else (0, 0)
    budget = Budget(cfg.memory_gib)
    key_rows = sum(docs.values()) * max(bands, 1)
    partitions = max(1, math.ceil(key_rows / budget.rows(KEY_ROW_BYTES, ROWS_PER_TASK)))
    per_range = budget.rows(LABEL_ROW_BYTES, DOCS_PER_RANGE)
    ranges: list[list[int]] = []
    n = 0
    for i, cid in enumerate(chunk_ids):
        if not ranges or n + docs[cid] > per_range:
            ranges.append([i, i])
            n = 0
        ranges[-1][1] = i + 1
        n += docs[cid]
    plan = {
        "chunks": chunk_ids,
        "partitions": partitions,
        "bands": bands,
        "band_rows": band_rows,
        "ranges": ranges,
        "enabled": d.exact or d.near,
    }
    write_json_atomic(paths.dedup_plan, plan)
    return plan


def _sum_rows(markers: Iterable[dict[str, Any]], n: int, each: Callable[[dict], None] = lambda m: None) -> list[int]:
    total = [0] * n
    for m in markers:
        total = [a + b for a, b in zip(total, m["rows"])]
        each(m)
    return total


def progress_units(cfg: PrepareConfig, chunk_ids: list[int]) -> int:
    """What :func:`run_dedup` advances its progress by: one per chunk for each per-chunk step."""
    return len(chunk_ids) * (1 + int(cfg.dedup.exact) + int(cfg.dedup.near))


def run_dedup(
    cfg: PrepareConfig,
    paths: Paths,
    chunk_ids: list[int],
    docs: dict[int, int],
    map_fn: MapFn,
    advance: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the job; returns per-language duplicates, kept bytes per chunk and
    language, the merged split draws and the job's counts. ``advance(n)`` moves the pass's progress
    (:func:`progress_units` in all)."""
    plan = make_plan(cfg, paths, chunk_ids, docs)
    out, gib, n = paths.where, cfg.memory_gib, plan["partitions"]

    def tick(marker: dict | None = None) -> None:  # by chunks done, per step over chunks
        if advance:
            advance(marker["chunks"] if marker else 1)

    stats: dict[str, Any] = {
        "partitions": n,
        "ranges": len(plan["ranges"]),
        "bands": plan["bands"],
        "rows_per_band": plan["band_rows"],
        "exact": 0,
        "candidates": 0,
        "confirmed": 0,
        "rounds": 0,
    }
    ranges = list(range(len(plan["ranges"])))
    label_rows = [0] * len(ranges)
    edges, sources = [0] * n, []
    if cfg.dedup.exact:
        rows = _sum_rows(map_fn(partial(exact_keys, out=out), ranges), n, tick)
        ms = list(map_fn(partial(exact_groups, out=out, memory_gib=gib), list(enumerate(rows))))
        edges = [e + r for e, r in zip(edges, _sum_rows(ms, n))]
        stats["exact"] = sum(m["duplicates"] for m in ms)
        sources.append("exact")
    if cfg.dedup.near:
        rows = _sum_rows(map_fn(partial(band_keys, cfg=cfg.dedup, out=out), ranges), n, tick)
        ms = list(map_fn(partial(find_pairs, cfg=cfg.dedup, out=out, memory_gib=gib), list(enumerate(rows))))
        edges = [e + r for e, r in zip(edges, _sum_rows(ms, n))]
        stats["candidates"] = sum(m["candidates"] for m in ms)
        stats["confirmed"] = sum(m["confirmed"] for m in ms)
        sources.append("pairs")
    if sources:
        one_task = Budget(gib).rows(EDGE_ROW_BYTES, ROWS_PER_TASK)
        stars, stats["rounds"] = run_stars(map_fn, out, edges, gib, sources, one_task)
        facts = [{"exact": "exact-facts", "pairs": "facts"}[s] for s in sources]
        label_rows = _sum_rows(
            map_fn(
                partial(label_nodes, out=out, stars=stars, memory_gib=gib, facts=facts),
                list(enumerate(edges)),
            ),
            len(plan["ranges"]),
        )
    decided = map_fn(partial(decide_range, cfg=cfg, out=out, memory_gib=gib), list(enumerate(label_rows)))
    duplicates, kept_bytes, draws = _summed(decided, cfg.pack.valid_min_docs, tick)
    return {"duplicates": duplicates, "kept_bytes": kept_bytes, "draws": draws, "stats": stats}


def _summed(
    decided: Iterable[list[dict[str, Any]]], valid_min_docs: int, tick: Callable[[], None]
) -> tuple[dict[str, dict[str, int]], dict[tuple[int, str], int], dict[str, SplitDraws]]:
    """The decide tasks' results summed: duplicates per language and reason, kept bytes per (chunk,
    language), and the split draws merged per language; ``tick`` once per chunk."""
    duplicates: dict[str, dict[str, int]] = {}
    kept_bytes: dict[tuple[int, str], int] = {}
    draws: dict[str, SplitDraws] = {}
    for results in decided:
        for r in results:
            for lang, kinds in r["duplicates"].items():
                for kind, c in kinds.items():
                    duplicates.setdefault(lang, {}).setdefault(kind, 0)
                    duplicates[lang][kind] += c
            for lang, k in r["kept"].items():
                kept_bytes[(r["id"], lang)] = k["bytes"]
                draws.setdefault(lang, SplitDraws()).merge(SplitDraws(**k["draws"]), valid_min_docs)
            tick()
    return duplicates, kept_bytes, draws


def dedup_record(
    cfg: PrepareConfig,
    paths: Paths,
    chunk_ids: list[int],
    docs: dict[int, int],
    map_fn: MapFn,
    advance: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The dedup pass: :func:`run_dedup`, then what its outcome decides for the passes after it —
    the validation hold-out rule per language (data_prep/passes/split.py, from the kept documents' draws)
    and the pack parts (data_prep/passes/pack.py ``plan_parts``, from the kept bytes). Returns its
    record, written atomically as the pass's marker ``.work/dedup.json`` (duplicates per
    language and reason, the split rule, the parts, kept documents and bytes per language), and
    the job's counts; (the record, None) when the marker was there already."""
    done = paths.work_file("dedup.json")
    if done.exists():
        return read_json(done), None
    job = run_dedup(cfg, paths, chunk_ids, docs, map_fn, advance)
    rules = validation_rules(job["draws"], cfg.pack.valid_fraction, cfg.pack.valid_min_docs)
    lang_bytes: dict[str, int] = {}
    for (_, lang), b in job["kept_bytes"].items():
        lang_bytes[lang] = lang_bytes.get(lang, 0) + b
    record = {
        "duplicates": {k: dict(sorted(v.items())) for k, v in sorted(job["duplicates"].items())},
        "split_rule": dict(sorted(rules.items())),
        "parts": plan_parts(paths, chunk_ids, job["kept_bytes"], rules, cfg.pack.part_bytes),
        "kept_docs": dict(sorted((k, v.docs) for k, v in job["draws"].items())),
        "kept_bytes": dict(sorted(lang_bytes.items())),
    }
    write_json_atomic(done, record)
    return record, job["stats"]
