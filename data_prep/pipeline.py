"""The prepare pipeline: its passes over an output folder, in order, each resumable.

:data:`PASSES` is the one table of them (name, function, progress unit, what it does, the file that
marks it done under ``DIR/.work`` unless noted). The driver runs it in order; the progress bars, the
Prefect tasks (flows/stages/prepare.py) and the timings in ``run_stats.json`` are named by it, and so are
the kill targets of the chaos harness and the passes listed in docs/prepare.md (tests check both).

Each pass skips work whose marker exists, every file is written atomically, and every choice is
seeded, so a run killed at any moment and started again produces the same bytes as an
uninterrupted run. The driver takes a ``map_fn(func, items)`` so the caller decides where parallel
work runs (Dask in the Prefect flow, a plain loop in unit tests).

Words: the main job (``bloomline pipeline``) has *stages* (prepare, train, evaluate: flows/stages/reuse.py);
prepare has *passes* (this table); a pass runs *steps* over documents (data_prep/steps/).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Iterator

from bloomline.errors import BloomlineError, ConfigError, DataError
from bloomline.io import read_json, sha256_tree, write_json_atomic
from bloomline.mirror import MirroredTask
from data_prep.config import PrepareConfig
from data_prep.dedup.driver import dedup_record, progress_units
from data_prep.inputs.chunk_plan import discover, plan_chunks
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


def fingerprint(cfg: PrepareConfig) -> str:
    """What the output depends on: :meth:`PrepareConfig.identity`, ``strict`` and the output format."""
    return sha256_tree({**cfg.identity(), "strict": cfg.strict, "format": FORMAT_VERSION})


def plan(cfg: PrepareConfig, paths: Paths) -> dict[str, Any]:
    """Cut the inputs into chunks and pin the run to its config; refuses a mismatched folder."""
    check_inputs(cfg)
    chunks = plan_chunks(cfg.sources, cfg.read, bundle_bytes(cfg))
    fp = fingerprint(cfg)
    if paths.manifest.exists():
        m = read_json(paths.manifest)
        if m.get("fingerprint") != fp:
            raise DataError(
                f"{paths.where} already holds prepared data made from another config or other inputs; "
                f"choose another --out or delete {paths.where}"
            )
        if not paths.work.exists():  # complete: nothing to resume, and no work folder to leave behind
            return {"fingerprint": fp, "work_version": WORK_VERSION, "chunks": [c.to_dict() for c in chunks]}
    plan_file = paths.work_file("plan.json")
    work = f"{paths.where}/{paths.work.name}"
    if plan_file.exists():
        old = read_json(plan_file)
        if old["fingerprint"] != fp:
            raise DataError(
                f"{paths.where} holds an unfinished run with another config or other inputs; "
                f"choose another --out, or delete {work} to start over"
            )
        if old.get("work_version") != WORK_VERSION:
            raise DataError(f"{work} was left by another version of bloomline; delete it to start over")
        return old
    paths.work.mkdir(parents=True, exist_ok=True)
    p = {"fingerprint": fp, "work_version": WORK_VERSION, "chunks": [c.to_dict() for c in chunks]}
    if cfg.decontaminate.tasks:  # built once per run, before the plan: a resumed run finds it
        p["decontaminate"] = build_index(cfg.decontaminate, paths.decontaminate)
    write_json_atomic(plan_file, p)
    return p


def preflight(cfg: PrepareConfig) -> None:
    """Fail on no input, a missing one, one that does not fit ``memory_gib``, or a bad ``dask``
    setting, in one line, before any server or cluster starts (the commands call it first)."""
    if not cfg.sources:
        raise BloomlineError("no inputs: give INPUT arguments or 'sources' in the config")
    try:
        cfg.dask.validate()  # --dask-address is set after the recipe was checked
    except ConfigError as e:
        raise ConfigError(f"dask.{e.key}", e.message) from None
    for s in cfg.sources:
        discover(s, check=True)
    check_inputs(cfg)


def is_complete(paths: Paths, fp: str) -> bool:
    return paths.manifest.exists() and read_json(paths.manifest).get("fingerprint") == fp


class Progress:
    """What the driver reports to, per pass; the CLI's implementation draws rich progress bars."""

    def start(self, name: str, total: int, unit: str) -> None: ...
    def advance(self, name: str, n: int = 1) -> None: ...
    def finish(self, name: str, message: str) -> None: ...


def _direct(name: str, fn: Callable[[], Any]) -> Any:
    return fn()


def run_all(
    cfg: PrepareConfig,
    out: str | Path,
    map_fn: MapFn = serial_map,
    as_task: Callable[[str, Callable[[], Any]], Any] = _direct,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run (or resume) every pass of :data:`PASSES`; returns the manifest plus ``run_stats`` (timings).

    ``as_task(name, fn)`` runs one coarse pass (the Prefect flow makes each a task named after it);
    ``map_fn(func, items)`` runs the fine-grained parallel work (Dask in the flow) and yields
    results as they complete.
    """
    paths = Paths.at(out)
    prepare_start(paths)
    run = Run(cfg, paths, map_fn, progress or Progress())
    t0 = time.perf_counter()
    try:
        for one in PASSES:
            run.results[one.name] = as_task(one.name, run.runner(one))
            if one.name == "plan" and is_complete(paths, run.results["plan"]["fingerprint"]):
                if not cfg.keep_work:  # a run killed between its manifest and this clean-up
                    clean_work(paths)
                m = read_json(paths.manifest)
                m["run_stats"] = {"already_complete": True}
                return m
        run.timings["total_seconds"] = time.perf_counter() - t0
        with mirrored(paths):
            write_json_atomic(paths.out / "run_stats.json", run.timings)
        if not cfg.keep_work:
            clean_work(paths)
    finally:
        if paths.store:  # the store holds it all; this machine's copy goes
            paths.store.close()
    manifest = dict(run.results["manifest"])
    manifest["run_stats"] = run.timings
    return manifest


def mirrored(paths: Paths) -> ContextManager[None]:
    """What is published in the block reaches the store of a folder at a URL when it ends
    (bloomline/mirror.py); nothing to do for a local folder."""
    return paths.store.task() if paths.store else contextlib.nullcontext()


class Run:
    """What every pass of one run shares: the settings, the folder, where parallel work runs, the
    progress display, the timings (``run_stats.json``) and the passes' results so far, by name."""

    def __init__(self, cfg: PrepareConfig, paths: Paths, map_fn: MapFn, progress: Progress):
        self.cfg, self.paths, self.progress = cfg, paths, progress
        self.timings: dict[str, Any] = {"tasks": {}}
        self.results: dict[str, Any] = {}
        self.current: Pass | None = None
        self._map_fn = map_fn

    def map(self, func: Callable[[Any], Any], items: list[Any]) -> Iterable[Any]:
        """The caller's map_fn, counting the parallel tasks (one an item) each function was given
        (``run_stats.json`` ``tasks``)."""
        name = getattr(getattr(func, "func", func), "__name__", "task")
        self.timings["tasks"][name] = self.timings["tasks"].get(name, 0) + len(items)
        if self.paths.store:  # the tasks read what this process wrote; each uploads what it writes
            self.paths.store.flush()
            func = MirroredTask(func, self.paths.where)
        return self._map_fn(func, items)

    def runner(self, one: Pass) -> Callable[[], Any]:
        """A call that runs ``one`` over this run: a closure, so that neither the run nor the pass
        is among the recorded parameters of the Prefect task that calls it."""

        def run_pass() -> Any:
            self.current = one
            with mirrored(self.paths):
                return one.fn(self)

        return run_pass

    def time(self, figures: dict[str, Any]) -> None:
        """The current pass's figures in ``run_stats.json``, under its name."""
        self.timings[self.current.name] = figures

    def start(self, total: int) -> None:
        """The current pass's progress bar, counting ``total`` of its unit."""
        self.progress.start(self.current.name, total, self.current.unit)

    def advance(self, n: int) -> None:
        self.progress.advance(self.current.name, n)

    def finish(self, message: str) -> None:
        self.progress.finish(self.current.name, message)

    @property
    def chunk_ids(self) -> list[int]:
        return [c["id"] for c in self.results["plan"]["chunks"]]


def plan_pass(run: Run) -> dict[str, Any]:
    """Pass plan: the chunks, and the run pinned to its config (:func:`plan`)."""
    t = time.perf_counter()
    p = plan(run.cfg, run.paths)
    run.time({"seconds": time.perf_counter() - t, "chunks": len(p["chunks"])})
    return p


def chunks_pass(run: Run) -> list[dict[str, Any]]:
    """Pass chunks: every chunk read, normalized, identified, filtered (data_prep/passes/chunks.py);
    their summaries in chunk order."""
    t = time.perf_counter()
    chunks = run.results["plan"]["chunks"]
    run.start(sum(c["size"] for c in chunks))
    sizes = {c["id"]: c["size"] for c in chunks}
    res = []
    for r in run.map(partial(process_chunk, cfg=run.cfg, out=run.paths.where), chunks):
        res.append(r)
        run.advance(sizes[r["id"]])
    res.sort(key=lambda r: r["id"])
    dt = time.perf_counter() - t
    recs = sum(r["steps"]["read"]["records"] for r in res)
    run.time({"seconds": dt, "records": recs, "docs_per_s": recs / dt if dt else None})
    steps = " → ".join(["read", *(name for name, _ in chunk_steps(run.cfg, run.paths))])
    run.finish(f"{recs} records through {steps} in {dt:.1f} s ({recs / max(dt, 1e-9):,.0f} docs/s)")
    return res


def dedup_pass(run: Run) -> dict[str, Any]:
    """Pass dedup (data_prep/dedup/driver.py ``dedup_record``): its record."""
    t = time.perf_counter()
    run.start(progress_units(run.cfg, run.chunk_ids))
    docs = {s["id"]: s["docs"] for s in run.results["chunks"]}
    d, stats = dedup_record(run.cfg, run.paths, run.chunk_ids, docs, run.map, run.advance)
    if stats is None:
        run.finish("done by an earlier run")
        return d
    dt = time.perf_counter() - t
    n = sum(sum(v.values()) for v in d["duplicates"].values())
    run.time({"seconds": dt, "duplicates": n, **stats})
    run.finish(
        f"{n} duplicates removed in {dt:.1f} s ({stats['partitions']} partitions, "
        f"{stats['confirmed']:,} near pairs confirmed of {stats['candidates']:,} candidates)"
    )
    return d


def tokenizer_pass(run: Run) -> dict[str, Any]:
    """Pass tokenizer (data_prep/passes/tokenizer.py ``build_tokenizer``)."""
    run.start(1)
    tok = build_tokenizer(run.cfg, run.paths, run.results["dedup"], run.chunk_ids, run.map)
    run.time({"seconds": tok.get("seconds")})
    how = "grew the" if tok.get("extends") else "trained" if tok["trained"] else "reused"
    run.finish(f"{how} tokenizer, vocab {tok['vocab_size']}")
    return tok


def pack_pass(run: Run) -> list[dict[str, Any]]:
    """Pass pack: every part tokenized and packed into shards (data_prep/passes/pack.py)."""
    t = time.perf_counter()
    # Largest parts first (LPT scheduling): the pass ends when its last part does.
    parts = sorted(run.results["dedup"]["parts"], key=lambda x: -x["bytes"])
    run.start(sum(x["bytes"] for x in parts))
    sizes = {(x["lang"], x["k"]): x["bytes"] for x in parts}
    tok_sha = run.results["tokenizer"]["sha256"]
    pack = partial(pack_part, cfg=run.cfg, out=run.paths.where, tok_sha=tok_sha)
    res = []
    for r in run.map(pack, parts):
        res.append(r)
        run.advance(sizes[(r["lang"], r["k"])])
    res.sort(key=lambda r: (r["lang"], r["k"]))
    dt = time.perf_counter() - t
    tokens = sum(s["tokens"] for r in res for s in r["shards"])
    run.time({"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt if dt else None})
    run.finish(f"{tokens:,} tokens in {dt:.1f} s ({tokens / max(dt, 1e-9):,.0f} tokens/s)")
    return res


def manifest_pass(run: Run) -> dict[str, Any]:
    """Pass manifest (data_prep/passes/manifest.py ``write_manifest``)."""
    r = run.results
    return write_manifest(run.cfg, run.paths, r["plan"], r["chunks"], r["dedup"], r["tokenizer"], r["pack"])


@dataclass(frozen=True)
class Pass:
    """One pass of ``bloomline prepare``."""

    name: str
    """Its progress bar's label, its Prefect task's name, its key in ``run_stats.json`` and in the
    driver's results, and, as ``prepare:<name>``, a kill target of the chaos harness."""
    fn: Callable[[Run], Any]
    """Runs it (or finds it done) and returns its record."""
    unit: str
    """What its progress bar counts (``B``: input bytes; "" for a pass without a bar)."""
    what: str
    """What it does, in a line."""
    marker: str
    """The file that marks it done, under ``DIR/.work`` unless it starts with ``DIR/``."""


PASSES = (
    Pass("plan", plan_pass, "", "find inputs, cut chunks, fingerprint config + inputs", "plan.json"),
    Pass(
        "chunks",
        chunks_pass,
        "B",
        "per chunk (parallel): read → normalize → langid → quality → decontaminate → dedup signatures; "
        "kept documents → Arrow",
        "chunks/cNNNNN.json",
    ),
    Pass(
        "dedup",
        dedup_pass,
        "tasks",
        "exact + near duplicates, a Dask job over partitioned files (data_prep/dedup/); validation rules; pack parts",
        "dedup.json",
    ),
    Pass("tokenizer", tokenizer_pass, "model", "alpha-smoothed sample → SentencePiece (or reuse)", "tokenizer.json"),
    Pass(
        "pack",
        pack_pass,
        "B",
        "per part (parallel): PII → tokenize → best-fit pack → Arrow shards under DIR/shards/",
        "parts/<lang>-pNNNNN.json",
    ),
    Pass("manifest", manifest_pass, "", "ledger, blend, shard list → DIR/manifest.json", "DIR/manifest.json"),
)
"""The passes, in the order they run; each reads the results of those before it."""
