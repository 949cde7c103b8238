"""The chunks pass: per chunk of input (in parallel), read → normalize → langid → quality →
decontaminate → dedup signatures; the kept documents go to one Arrow file per chunk, sorted by language, and a
summary (ledger, per-step stats) marks the chunk done."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import pyarrow as pa

from bloomline.io import publish, read_json, tmp_path, write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.inputs.chunk_plan import Chunk
from data_prep.inputs.readers import ChunkReader
from data_prep.steps.decontaminate import Decontaminator, load_index
from data_prep.steps.document import Document, Ledger, uniform_draw
from data_prep.steps.filters import QualityFilter
from data_prep.steps.langid import LanguageIdFilter
from data_prep.steps.minhash import DedupSigner
from data_prep.steps.normalize import Normalizer
from data_prep.steps.step import PipelineStep
from data_prep.storage.droplog import DROP_SCHEMA, SCORE_SCHEMA, DropLog, dropped_path, scores_path, write_rows
from data_prep.storage.workdir import Paths

CHUNK_SCHEMA = pa.schema(
    [
        ("pos", pa.int64()),
        ("id", pa.string()),
        ("loc", pa.string()),
        ("lang", pa.string()),
        ("text", pa.string()),
        ("exact", pa.uint64()),
        ("minhash", pa.list_(pa.uint32())),
        ("valid_draw", pa.float64()),
        ("nbytes", pa.int64()),
    ]
)
"""A chunk's kept documents, sorted by (lang, pos): ``exact``/``minhash`` for deduplication
(data_prep/dedup/), ``valid_draw`` the document's seeded draw for the validation split
(data_prep/passes/split.py), ``nbytes`` its UTF-8 size."""


StepBuilder = Callable[[Ledger], PipelineStep]
"""``ledger -> step``: one per-document step of a chunk, built in the worker."""


def chunk_steps(cfg: PrepareConfig, paths: Paths) -> list[tuple[str, StepBuilder]]:
    """The recipe's per-document steps of a chunk, in order, after ``read``: (name, builder).
    datatrove-style, a chunk is this list run over its documents; the names are what the
    chunks pass's progress line and the chunk summaries (``steps``, ``seconds``) show."""
    steps: list[tuple[str, StepBuilder]] = [(Normalizer.name, lambda ledger: Normalizer(ledger))]
    if cfg.langid.enabled:
        steps.append((LanguageIdFilter.name, lambda ledger: LanguageIdFilter(cfg.langid, ledger)))
    if cfg.filters.enabled:
        steps.append((QualityFilter.name, lambda ledger: QualityFilter(cfg.filters, ledger)))
    if cfg.decontaminate.tasks:  # the planner's index, loaded once per worker process
        steps.append(
            (
                Decontaminator.name,
                lambda ledger: Decontaminator(cfg.decontaminate, load_index(paths.decontaminate), ledger),
            )
        )
    steps.append((DedupSigner.name, lambda ledger: DedupSigner(cfg.dedup, ledger)))
    return steps


def process_chunk(chunk: dict[str, Any], cfg: PrepareConfig, out: str) -> dict[str, Any]:
    """Run the per-document steps over one chunk; write kept docs (sorted by language)."""
    paths = Paths.at(out)
    done = paths.chunk_done(chunk["id"])
    if done.exists():
        return read_json(done)
    t0 = time.perf_counter()
    ledger = Ledger(DropLog(cfg.dropped_text_chars), cfg.strict)
    reader = ChunkReader(Chunk(**chunk), cfg.read, ledger)
    steps = [build(ledger) for _, build in chunk_steps(cfg, paths)]
    docs: Iterable[Document] = reader.run()
    for step in steps:
        docs = step.run(docs)
    kept = sorted(docs, key=lambda d: (d.lang, d.pos))
    cols = {
        "pos": [d.pos for d in kept],
        "id": [d.id for d in kept],
        "loc": [d.loc for d in kept],
        "lang": [d.lang for d in kept],
        "text": [d.text for d in kept],
        "exact": [d.meta["exact"] for d in kept],
        "minhash": [d.meta.get("minhash") for d in kept],
        "valid_draw": [uniform_draw(cfg.seed, "valid", d.id, d.meta["exact"]) for d in kept],
        "nbytes": [len(d.text.encode("utf-8")) for d in kept],
    }
    table = pa.table(cols, schema=CHUNK_SCHEMA)
    data = paths.chunk_data(chunk["id"])
    data.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(data)
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, CHUNK_SCHEMA) as w:
        w.write_table(table, max_chunksize=4096)
    publish(tmp, data)
    # the drop log and the filter scores of this chunk, before its marker (data_prep/storage/droplog.py)
    write_rows(dropped_path(paths.out, "chunk", chunk["id"]), ledger.log.in_input_order(), DROP_SCHEMA)
    write_rows(scores_path(paths.out, chunk["id"]), [r for st in steps for r in st.score_rows()], SCORE_SCHEMA)
    ranges: dict[str, list[int]] = {}
    nbytes: dict[str, int] = {}
    for i, (d, size) in enumerate(zip(kept, cols["nbytes"])):
        r = ranges.setdefault(d.lang, [i, i])
        r[1] = i + 1
        nbytes[d.lang] = nbytes.get(d.lang, 0) + size
    summary = {
        "id": chunk["id"],
        "docs": len(kept),
        "ledger": ledger.to_dict(),
        "lang_ranges": ranges,
        "lang_bytes": nbytes,
        "steps": {"read": reader.report(), **{s.name: s.report() for s in steps}},
        "seconds": {"read": reader.seconds, **{s.name: s.seconds for s in steps}, "total": time.perf_counter() - t0},
    }
    write_json_atomic(done, summary)
    return summary


def chunk_table(paths: Paths, cid: int, columns: list[str]) -> pa.Table:
    """The kept documents of chunk ``cid`` (memory-mapped)."""
    with pa.memory_map(str(paths.chunk_data(cid)), "r") as src:
        return pa.ipc.open_file(src).read_all().select(columns)


def dropped_positions(paths: Paths, cid: int) -> set[int]:
    """Input positions of chunk ``cid``'s documents the dedup pass dropped."""
    return {p for p, _ in read_json(paths.chunk_drops(cid))["drops"]}
