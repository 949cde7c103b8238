"""The prepare pipeline as resumable stages over an output folder.

Stages and the files that mark them done (all under ``DIR/.work`` unless noted):

==========  ===================================================  ==============================
stage        what                                                 done when
==========  ===================================================  ==============================
plan         find inputs, cut chunks, fingerprint config+inputs   ``plan.json``
chunks       per chunk (parallel): read → normalize → langid →    ``chunks/cNNNNN.json``
             quality → dedup signatures; kept docs → Arrow
dedup        exact + near duplicates, a Dask job over partitioned    ``dedup.json``
             files (data_prep/dedup/); validation rules; pack parts
tokenizer    alpha-smoothed sample → SentencePiece (or reuse)      ``tokenizer.json``
pack         per part (parallel): PII → tokenize → best-fit pack   ``parts/<lang>-pNNNNN.json``
             → Arrow shards under ``DIR/shards/``
manifest     ledger, blend, shard list → ``DIR/manifest.json``     ``DIR/manifest.json``
==========  ===================================================  ==============================

Each stage skips work whose marker exists, every file is written atomically, and every choice
is seeded, so a run killed at any moment and started again produces the same bytes as an
uninterrupted run. The driver here takes a ``map_fn(func, items)`` so the caller decides
where parallel work runs (Dask in the Prefect flow, a plain loop in unit tests).

One file per stage: ``chunks.py``, ``dedup/stage.py`` (with ``split.py`` for the validation rules
and ``pack_parts.plan_parts``), ``tokenizer.py`` (``build_tokenizer``), ``pack_parts.py``,
``manifest.py``; the folder layout is ``workdir.py``; what each process may hold, ``budget.py``.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from bloomline.errors import DataError
from bloomline.io import read_json, sha256_tree, write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.dedup.driver import dedup_record, progress_units
from data_prep.inputs.readers import plan_chunks
from data_prep.passes.budget import bundle_bytes, check_inputs
from data_prep.passes.chunks import chunk_steps, process_chunk
from data_prep.passes.manifest import write_manifest
from data_prep.passes.pack import pack_part
from data_prep.passes.tokenizer import build_tokenizer
from data_prep.steps.decontaminate import build_index
from data_prep.storage.shards import FORMAT_VERSION
from data_prep.storage.workdir import Paths, clean_work, prepare_start

MapFn = Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]]
WORK_VERSION = 2
"""Layout of ``DIR/.work``; an unfinished run left by another layout is not resumed."""


def serial_map(func: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
    return (func(x) for x in items)


def fingerprint(cfg: PrepareConfig, strict: bool) -> str:
    """What the output depends on: :meth:`PrepareConfig.identity`, ``strict`` and the output format."""
    return sha256_tree({**cfg.identity(), "strict": strict, "format": FORMAT_VERSION})


def plan(cfg: PrepareConfig, paths: Paths, strict: bool = False) -> dict[str, Any]:
    """Cut the inputs into chunks and pin the run to its config; refuses a mismatched folder."""
    check_inputs(cfg)
    chunks = plan_chunks(cfg.sources, cfg.read, bundle_bytes(cfg))
    fp = fingerprint(cfg, strict)
    if paths.manifest.exists():
        m = read_json(paths.manifest)
        if m.get("fingerprint") != fp:
            raise DataError(
                f"{paths.out} already holds prepared data made from another config or other inputs; "
                f"choose another --out or delete {paths.out}"
            )
        if not paths.work.exists():  # complete: nothing to resume, and no work folder to leave behind
            return {"fingerprint": fp, "work_version": WORK_VERSION, "chunks": [c.to_dict() for c in chunks]}
    plan_file = paths.work / "plan.json"
    if plan_file.exists():
        old = read_json(plan_file)
        if old["fingerprint"] != fp:
            raise DataError(
                f"{paths.out} holds an unfinished run with another config or other inputs; "
                f"choose another --out, or delete {paths.work} to start over"
            )
        if old.get("work_version") != WORK_VERSION:
            raise DataError(f"{paths.work} was left by another version of bloomline; delete it to start over")
        return old
    paths.work.mkdir(parents=True, exist_ok=True)
    p = {"fingerprint": fp, "work_version": WORK_VERSION, "chunks": [c.to_dict() for c in chunks]}
    if cfg.decontaminate.tasks:  # built once per run, before the plan: a resumed run finds it
        p["decontaminate"] = build_index(cfg.decontaminate, paths.decontaminate)
    write_json_atomic(plan_file, p)
    return p


def is_complete(paths: Paths, fp: str) -> bool:
    return paths.manifest.exists() and read_json(paths.manifest).get("fingerprint") == fp


class Progress:
    """What the driver reports to; the CLI's implementation draws rich progress bars."""

    def start(self, stage: str, total: int, unit: str) -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def finish(self, stage: str, message: str) -> None: ...


def _stage_direct(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def run_all(
    cfg: PrepareConfig,
    out: str | Path,
    strict: bool = False,
    map_fn: MapFn = serial_map,
    stage: Callable[..., Any] = _stage_direct,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run (or resume) every stage; returns the manifest plus ``run_stats`` (timings).

    ``stage(name, fn, *args)`` runs one coarse stage (the Prefect flow makes each a task);
    ``map_fn(func, items)`` runs the fine-grained parallel work (Dask in the flow) and yields
    results as they complete.
    """
    paths = Paths(Path(out).resolve())
    prepare_start(paths)
    run = Run(cfg, paths, strict, map_fn, progress or Progress())
    t0 = time.perf_counter()
    p = stage("plan", plan, cfg, paths, strict)
    run.timings["plan"] = {"seconds": time.perf_counter() - t0, "chunks": len(p["chunks"])}
    if is_complete(paths, p["fingerprint"]):
        if not cfg.keep_work:  # a run killed between its manifest and this clean-up
            clean_work(paths)
        m = read_json(paths.manifest)
        m["run_stats"] = {"already_complete": True}
        return m
    chunk_ids = [c["id"] for c in p["chunks"]]

    # closures: a stage's inputs stay out of its Prefect task's recorded parameters
    def read_filter_stage() -> list[dict[str, Any]]:
        return read_filter(run, p["chunks"])

    summaries = stage("read_filter", read_filter_stage)

    def dedup_stage() -> dict[str, Any]:
        return deduplicate(run, chunk_ids, summaries)

    dedup = stage("dedup", dedup_stage)

    def tokenizer_stage() -> dict[str, Any]:
        return tokenizer(run, dedup, chunk_ids)

    tok = stage("tokenizer", tokenizer_stage)

    def pack_stage() -> list[dict[str, Any]]:
        return tokenize_pack(run, dedup, tok)

    part_results = stage("tokenize_pack", pack_stage)
    manifest = stage("manifest", write_manifest, cfg, paths, p, summaries, dedup, tok, part_results)
    run.timings["total_seconds"] = time.perf_counter() - t0
    write_json_atomic(paths.out / "run_stats.json", run.timings)
    if not cfg.keep_work:
        clean_work(paths)
    manifest = dict(manifest)
    manifest["run_stats"] = run.timings
    return manifest


class Run:
    """What every stage of one run shares: the settings, the folder, where parallel work runs, the
    progress display, and the timings (``run_stats.json``)."""

    def __init__(self, cfg: PrepareConfig, paths: Paths, strict: bool, map_fn: MapFn, progress: Progress):
        self.cfg, self.paths, self.strict, self.progress = cfg, paths, strict, progress
        self.timings: dict[str, Any] = {"tasks": {}}
        self._map_fn = map_fn

    def map(self, func: Callable[[Any], Any], items: list[Any]) -> Iterable[Any]:
        """The caller's map_fn, counting the parallel tasks (one an item) each function was given
        (``run_stats.json`` ``tasks``)."""
        name = getattr(getattr(func, "func", func), "__name__", "task")
        self.timings["tasks"][name] = self.timings["tasks"].get(name, 0) + len(items)
        return self._map_fn(func, items)


def read_filter(run: Run, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stage chunks: every chunk read, normalized, identified, filtered (data_prep/passes/chunks.py);
    their summaries in chunk order."""
    t = time.perf_counter()
    run.progress.start("read+filter", sum(c["size"] for c in chunks), "B")
    sizes = {c["id"]: c["size"] for c in chunks}
    res = []
    for r in run.map(partial(process_chunk, cfg=run.cfg, out=str(run.paths.out), strict=run.strict), chunks):
        res.append(r)
        run.progress.advance("read+filter", sizes[r["id"]])
    res.sort(key=lambda r: r["id"])
    dt = time.perf_counter() - t
    recs = sum(r["steps"]["read"]["records"] for r in res)
    run.timings["chunks"] = {"seconds": dt, "records": recs, "docs_per_s": recs / dt if dt else None}
    steps = " → ".join(["read", *(name for name, _ in chunk_steps(run.cfg, run.paths))])
    run.progress.finish(
        "read+filter", f"{recs} records through {steps} in {dt:.1f} s ({recs / max(dt, 1e-9):,.0f} docs/s)"
    )
    return res


def deduplicate(run: Run, chunk_ids: list[int], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Stage dedup (data_prep/dedup/driver.py ``dedup_record``): its record."""
    t = time.perf_counter()
    run.progress.start("dedup", progress_units(run.cfg, chunk_ids), "tasks")
    docs = {s["id"]: s["docs"] for s in summaries}
    d, stats = dedup_record(run.cfg, run.paths, chunk_ids, docs, run.map, run.progress)
    if stats is None:
        run.progress.finish("dedup", "done by an earlier run")
        return d
    dt = time.perf_counter() - t
    n = sum(sum(v.values()) for v in d["duplicates"].values())
    run.timings["dedup"] = {"seconds": dt, "duplicates": n, **stats}
    run.progress.finish(
        "dedup",
        f"{n} duplicates removed in {dt:.1f} s ({stats['partitions']} partitions, "
        f"{stats['confirmed']:,} near pairs confirmed of {stats['candidates']:,} candidates)",
    )
    return d


def tokenizer(run: Run, dedup: dict[str, Any], chunk_ids: list[int]) -> dict[str, Any]:
    """Stage tokenizer (data_prep/passes/tokenizer.py ``build_tokenizer``)."""
    run.progress.start("tokenizer", 1, "model")
    tok = build_tokenizer(run.cfg, run.paths, dedup, chunk_ids, run.map)
    run.timings["tokenizer"] = {"seconds": tok.get("seconds")}
    run.progress.finish(
        "tokenizer", f"{'trained' if tok['trained'] else 'reused'} tokenizer, vocab {tok['vocab_size']}"
    )
    return tok


def tokenize_pack(run: Run, dedup: dict[str, Any], tok: dict[str, Any]) -> list[dict[str, Any]]:
    """Stage pack: every part tokenized and packed into shards (data_prep/passes/pack.py)."""
    t = time.perf_counter()
    # Largest parts first (LPT scheduling): the stage ends when its last part does.
    parts = sorted(dedup["parts"], key=lambda x: -x["bytes"])
    run.progress.start("tokenize+pack", sum(x["bytes"] for x in parts), "B")
    sizes = {(x["lang"], x["k"]): x["bytes"] for x in parts}
    pack = partial(pack_part, cfg=run.cfg, out=str(run.paths.out), tok_sha=tok["sha256"], strict=run.strict)
    res = []
    for r in run.map(pack, parts):
        res.append(r)
        run.progress.advance("tokenize+pack", sizes[(r["lang"], r["k"])])
    res.sort(key=lambda r: (r["lang"], r["k"]))
    dt = time.perf_counter() - t
    tokens = sum(s["tokens"] for r in res for s in r["shards"])
    run.timings["pack"] = {"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt if dt else None}
    run.progress.finish("tokenize+pack", f"{tokens:,} tokens in {dt:.1f} s ({tokens / max(dt, 1e-9):,.0f} tokens/s)")
    return res
