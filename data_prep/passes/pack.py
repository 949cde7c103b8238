"""The pack pass, per part of one language (in parallel): PII redaction → tokenize → best-fit
packing into length buckets → Arrow shards under ``DIR/shards/`` (``data_prep/FORMAT.md``),
each document sent to train or validation by its split rule (``data_prep/passes/split.py``); and
:func:`plan_parts`, how each language's kept documents are cut into those parts."""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

import numpy as np

from bloomline.io import read_json, write_json_atomic
from bloomline.tokenizer import open_tokenizer
from data_prep.config import PrepareConfig
from data_prep.passes.best_fit import BucketPacker
from data_prep.passes.chunks import chunk_table, dropped_positions
from data_prep.passes.split import held_out
from data_prep.steps.document import Document, Ledger
from data_prep.steps.pii import PIIRedactor
from data_prep.steps.step import drop_document, failure
from data_prep.storage.droplog import DROP_SCHEMA, DropLog, pack_dropped_path, write_rows
from data_prep.storage.shards import ShardWriter
from data_prep.storage.workdir import Paths, shard_path


def pack_part(part: dict[str, Any], cfg: PrepareConfig, out: str, tok_sha: str) -> dict[str, Any]:
    """Pack one part (``DIR/.work/parts/<lang>-pNNNNN.json`` marks it done). A document PII
    redaction or the tokenizer fails on is booked as an error (``pii.<exception>``,
    ``tokenize.<exception>``) in the ledger and ``dropped/pack-<lang>-pNNNNN.parquet``; the part
    goes on (the recipe's ``strict``: it stops there)."""
    paths = Paths.at(out)
    done = paths.part_done(part["lang"], part["k"])
    if done.exists():
        return read_json(done)
    packing = PartPacking(part, cfg, paths, tok_sha)
    try:
        batches: dict[str, list[Document]] = {"train": [], "valid": []}
        for split, doc in packing.documents(part["slices"], part["split_rule"]):
            batches[split].append(doc)
            if len(batches[split]) >= cfg.pack.tokenize_batch:
                packing.add(split, batches[split])
                batches[split] = []
        for split, batch in batches.items():
            if batch:
                packing.add(split, batch)
        shards = packing.close()
    except BaseException:
        packing.abort()
        raise
    write_rows(
        pack_dropped_path(paths.out, packing.lang, packing.k), packing.ledger.log.rows, DROP_SCHEMA
    )  # before the marker
    result = {
        "lang": packing.lang,
        "k": packing.k,
        "shards": shards,
        "ledger": packing.ledger.to_dict(),
        "docs": packing.docs,
        "pii": dict(sorted(packing.pii.counts.items())),
        "seconds": {**{st.name: st.seconds for st in packing.steps}, **packing.secs},
    }
    write_json_atomic(done, result)
    return result


class PartPacking:
    """One part on its way to shards: its documents after PII redaction, tokenized in batches,
    packed per split into length buckets, written per (split, bucket); with its ledger, counts
    and seconds per step."""

    def __init__(self, part: dict[str, Any], cfg: PrepareConfig, paths: Paths, tok_sha: str):
        self.lang, self.k = part["lang"], part["k"]
        self.cfg, self.paths = cfg, paths
        self.tok = open_tokenizer(paths.tokenizer, tok_sha)
        self.ledger = Ledger(DropLog(cfg.dropped_text_chars), cfg.strict)
        self.packers = {s: BucketPacker(cfg.pack.buckets, cfg.pack.max_open_samples) for s in ("train", "valid")}
        self.writers: dict[tuple[str, int], ShardWriter] = {}
        self.secs = {"tokenize": 0.0, "pack": 0.0, "write": 0.0}
        self.pii = PIIRedactor(cfg.pii, self.ledger)
        self.steps = [self.pii] if cfg.pii.enabled else []
        """The per-document steps before tokenizing (datatrove-style: a list run over documents)."""
        self.docs = {"train": 0, "valid": 0}

    def failed(self, step: str, e: Exception, doc: Document) -> None:
        drop_document(self.ledger, step, doc, "errors", failure(step, e))

    def documents(self, slices: list[list[int]], split_rule: Any) -> Iterator[tuple[str, Document]]:
        """(split, document) of the part's slices of chunks, in order: the ones dedup dropped left
        out, then through the stage's steps (PII redaction; a document a step fails on is booked
        and left out)."""
        docs: Iterable[Document] = self.read(slices)
        for step in self.steps:
            docs = step.run(docs)
        for doc in docs:
            yield ("valid" if held_out(doc.meta["valid_draw"], split_rule) else "train"), doc

    def read(self, slices: list[list[int]]) -> Iterator[Document]:
        columns = ("pos", "id", "loc", "text", "valid_draw")
        for cid, start, end in slices:
            drops = dropped_positions(self.paths, cid)
            t = chunk_table(self.paths, cid, list(columns)).slice(start, end - start)
            for pos, doc_id, loc, text, u in zip(*(t.column(c).to_pylist() for c in columns)):
                if pos not in drops:
                    yield Document(text=text, lang=self.lang, id=doc_id, loc=loc, pos=pos, meta={"valid_draw": u})

    def encode(self, batch: list[Document]) -> list[tuple[Document, np.ndarray]]:
        """The batch's token ids, each document's ending in EOS, as int32 arrays; when the batch
        fails, document by document, those that fail booked."""
        try:
            return list(zip(batch, self.tok.encode_batch([d.text for d in batch])))
        except Exception:  # noqa: BLE001 - find the document(s) it failed on
            ok = []
            for d in batch:
                try:
                    ok.append((d, self.tok.encode_batch([d.text])[0]))
                except Exception as e:  # noqa: BLE001
                    self.failed("tokenize", e, d)
            return ok

    def add(self, split: str, batch: list[Document]) -> None:
        """Tokenize a batch of one split and pack it; full samples go to the shards."""
        t = time.perf_counter()
        encoded = self.encode(batch)
        self.secs["tokenize"] += time.perf_counter() - t
        for doc, arr in encoded:
            self.docs[split] += 1
            self.ledger.keep(self.lang, len(doc.text.encode("utf-8")), len(arr))
            t = time.perf_counter()
            samples = self.packers[split].add(arr)
            self.secs["pack"] += time.perf_counter() - t
            if samples:
                self.emit(split, samples)

    def emit(self, split: str, samples: Iterable[Any]) -> None:
        t = time.perf_counter()
        for s in samples:
            w = self.writers.get((split, s.bucket))
            if w is None:
                path = self.paths.out / shard_path(split, self.lang, s.bucket, self.k)
                w = self.writers[(split, s.bucket)] = ShardWriter(path, self.lang, s.bucket, split)
            w.add(s)
        self.secs["write"] += time.perf_counter() - t

    def close(self) -> list[dict[str, Any]]:
        """The packers' last samples written, every shard closed; the shards' entries."""
        for split in ("train", "valid"):
            t = time.perf_counter()
            tail = self.packers[split].flush()
            self.secs["pack"] += time.perf_counter() - t
            self.emit(split, tail)
        shards = []
        t = time.perf_counter()
        for (split, bucket), w in sorted(self.writers.items()):
            info = w.close()
            path = shard_path(split, self.lang, bucket, self.k)
            shards.append({"path": path, "split": split, "bucket": bucket, "lang": self.lang, **info})
        self.secs["write"] += time.perf_counter() - t
        return shards

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


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
