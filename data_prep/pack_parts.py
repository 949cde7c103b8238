"""The pack stage, per part of one language (in parallel): PII redaction → tokenize → best-fit
packing into length buckets → Arrow shards under ``DIR/shards/`` (``data_prep/FORMAT.md``),
each document sent to train or validation by its split rule (``data_prep/split.py``); and
:func:`plan_parts`, how each language's kept documents are cut into those parts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bloomline.io import read_json, write_json_atomic
from data_prep.chunks import chunk_table, dropped_positions
from data_prep.config import PrepareConfig
from data_prep.document import Document, Ledger
from data_prep.droplog import DROP_SCHEMA, DropLog, pack_dropped_path, write_rows
from data_prep.packing import BucketPacker
from data_prep.pii import redact
from data_prep.shards import ShardWriter
from data_prep.split import held_out
from data_prep.step import drop_document, failure
from data_prep.tokenizer import processor
from data_prep.workdir import Paths, shard_path


def pack_part(part: dict[str, Any], cfg: PrepareConfig, out: str, tok_sha: str, strict: bool = False) -> dict[str, Any]:
    """Pack one part (``DIR/.work/parts/<lang>-pNNNNN.json`` marks it done). A document PII
    redaction or the tokenizer fails on is booked as an error (``pii.<exception>``,
    ``tokenize.<exception>``) in the ledger and ``dropped/pack-<lang>-pNNNNN.parquet``; the part
    goes on (``strict``: it stops there)."""
    paths = Paths(Path(out))
    lang, k = part["lang"], part["k"]
    done = paths.part_done(lang, k)
    if done.exists():
        return read_json(done)
    sp = processor(str(paths.tokenizer), tok_sha)
    eos = sp.eos_id()
    ledger = Ledger(DropLog(cfg.dropped_text_chars))

    def failed(step: str, e: Exception, doc: Document) -> None:
        drop_document(ledger, step, doc, "errors", failure(step, e), strict)

    packers = {s: BucketPacker(cfg.pack.buckets, cfg.pack.max_open_samples) for s in ("train", "valid")}
    writers: dict[tuple[str, int], ShardWriter] = {}
    secs = {"pii": 0.0, "tokenize": 0.0, "pack": 0.0, "write": 0.0}
    pii_counts: dict[str, int] = {}
    docs = {"train": 0, "valid": 0}

    def emit(split: str, samples) -> None:
        t = time.perf_counter()
        for s in samples:
            w = writers.get((split, s.bucket))
            if w is None:
                w = writers[(split, s.bucket)] = ShardWriter(
                    paths.out / shard_path(split, lang, s.bucket, k), lang, s.bucket, split
                )
            w.add(s)
        secs["write"] += time.perf_counter() - t

    def encode(batch: list[Document]) -> list[tuple[Document, list[int]]]:
        """The batch's token ids; when the batch fails, document by document, those that fail booked."""
        try:
            return list(zip(batch, sp.encode([d.text for d in batch])))
        except Exception:  # noqa: BLE001 - find the document(s) it failed on
            ok = []
            for d in batch:
                try:
                    ok.append((d, sp.encode(d.text)))
                except Exception as e:  # noqa: BLE001
                    failed("tokenize", e, d)
            return ok

    def run_batch(split: str, batch: list[Document]) -> None:
        t = time.perf_counter()
        encoded = encode(batch)
        secs["tokenize"] += time.perf_counter() - t
        for doc, ids in encoded:
            text = doc.text
            docs[split] += 1
            ids.append(eos)
            arr = np.asarray(ids, dtype=np.int32)
            ledger.keep(lang, len(text.encode("utf-8")), len(arr))
            t = time.perf_counter()
            samples = packers[split].add(arr)
            secs["pack"] += time.perf_counter() - t
            if samples:
                emit(split, samples)

    try:
        batches: dict[str, list[Document]] = {"train": [], "valid": []}
        columns = ("pos", "id", "loc", "text", "valid_draw")
        for cid, start, end in part["slices"]:
            drops = dropped_positions(paths, cid)
            t = chunk_table(paths, cid, list(columns)).slice(start, end - start)
            for pos, doc_id, loc, text, u in zip(*(t.column(c).to_pylist() for c in columns)):
                if pos in drops:
                    continue
                doc = Document(text=text, lang=lang, id=doc_id, loc=loc)
                split = "valid" if held_out(u, part["split_rule"]) else "train"
                if cfg.pii.enabled:
                    tp = time.perf_counter()
                    try:
                        doc.text, counts = redact(text, cfg.pii.kinds)
                    except Exception as e:  # noqa: BLE001 - one document's failure is that document's error
                        failed("pii", e, doc)
                        continue
                    finally:
                        secs["pii"] += time.perf_counter() - tp
                    for kind, n in counts.items():
                        pii_counts[kind] = pii_counts.get(kind, 0) + n
                        ledger.pii(lang, kind, n)
                batches[split].append(doc)
                if len(batches[split]) >= cfg.pack.tokenize_batch:
                    run_batch(split, batches[split])
                    batches[split] = []
        for split in ("train", "valid"):
            if batches[split]:
                run_batch(split, batches[split])
            t = time.perf_counter()
            tail = packers[split].flush()
            secs["pack"] += time.perf_counter() - t
            emit(split, tail)
        shards = []
        t = time.perf_counter()
        for (split, bucket), w in sorted(writers.items()):
            info = w.close()
            shards.append(
                {"path": shard_path(split, lang, bucket, k), "split": split, "bucket": bucket, "lang": lang, **info}
            )
        secs["write"] += time.perf_counter() - t
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    write_rows(pack_dropped_path(paths.out, lang, k), ledger.log.rows, DROP_SCHEMA)  # before the marker
    result = {
        "lang": lang,
        "k": k,
        "shards": shards,
        "ledger": ledger.to_dict(),
        "docs": docs,
        "pii": dict(sorted(pii_counts.items())),
        "seconds": secs,
    }
    write_json_atomic(done, result)
    return result


def plan_parts(
    paths: Paths, chunk_ids: list[int], kept_bytes: dict[tuple[int, str], int], rules: dict[str, list], part_bytes: int
) -> list[dict[str, Any]]:
    """Per language, consecutive chunk slices of about ``part_bytes`` kept bytes per part."""
    parts: list[dict[str, Any]] = []
    chunk_stats = {cid: read_json(paths.chunk_done(cid)) for cid in chunk_ids}
    for lang in sorted(rules):
        cur: dict[str, Any] | None = None
        for cid in chunk_ids:
            rng = chunk_stats[cid]["lang_ranges"].get(lang)
            if not rng:
                continue
            if cur is None or cur["bytes"] >= part_bytes:
                cur = {
                    "lang": lang,
                    "k": sum(p["lang"] == lang for p in parts),
                    "slices": [],
                    "bytes": 0,
                    "split_rule": rules[lang],
                }
                parts.append(cur)
            cur["slices"].append([cid, rng[0], rng[1]])
            cur["bytes"] += kept_bytes.get((cid, lang), 0)
    return parts
