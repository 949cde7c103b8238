"""The prepare pipeline as resumable stages over an output folder.

Stages and the files that mark them done (all under ``DIR/.work`` unless noted):

==========  ===================================================  ==============================
stage        what                                                 done when
==========  ===================================================  ==============================
plan         find inputs, cut chunks, fingerprint config+inputs   ``plan.json``
chunks       per chunk (parallel): read → normalize → langid →    ``chunks/cNNNNN.json``
             quality → dedup signatures; kept docs → Arrow
dedup        one ordered pass: exact + near duplicates; choose     ``dedup.json``
             validation docs; plan pack parts
tokenizer    alpha-smoothed sample → SentencePiece (or reuse)      ``tokenizer.json``
pack         per part (parallel): PII → tokenize → best-fit pack   ``parts/<lang>-pNNNNN.json``
             → Arrow shards under ``DIR/shards/``
manifest     ledger, blend, shard list → ``DIR/manifest.json``     ``DIR/manifest.json``
==========  ===================================================  ==============================

Each stage skips work whose marker exists, every file is written atomically, and every choice
is seeded, so a run killed at any moment and started again produces the same bytes as an
uninterrupted run. The functions here take a ``map_fn(func, items)`` so the caller decides
where parallel work runs (Dask in the Prefect flow, a plain loop in unit tests).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import xxhash

import bloomline
from bloomline import languages
from bloomline.config import to_dict
from bloomline.errors import DataError
from bloomline.io import read_json, remove_stale_tmp, sha256_file, write_json_atomic
from data_prep.config import PrepareConfig
from data_prep.dedup import DedupSigner, Deduplicator
from data_prep.document import Document, Ledger
from data_prep.filters import QualityFilter
from data_prep.langid import LanguageIdFilter
from data_prep.normalize import Normalizer
from data_prep.packing import BucketPacker
from data_prep.pii import redact
from data_prep.readers import Chunk, ChunkReader, plan_chunks
from data_prep.shards import FORMAT_VERSION, ShardWriter
from data_prep.step import merge_reports
from data_prep.tokenizer import alpha_weights, check_model, sample_lines, train

MapFn = Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]]


def serial_map(func: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
    return (func(x) for x in items)


def _u(seed: int, salt: str, doc_id: str, exact: int) -> float:
    """A document's uniform draw in [0, 1): stable for the same seed, id and text."""
    return xxhash.xxh64_intdigest(f"{seed}:{salt}:{doc_id}:{exact}".encode()) / 2.0**64


@dataclass
class Paths:
    out: Path

    @property
    def work(self) -> Path:
        return self.out / ".work"

    def chunk_data(self, cid: int) -> Path:
        return self.work / "chunks" / f"c{cid:06d}.arrow"

    def chunk_done(self, cid: int) -> Path:
        return self.work / "chunks" / f"c{cid:06d}.json"

    def chunk_drops(self, cid: int) -> Path:
        return self.work / "dedup" / f"c{cid:06d}.json"

    def part_done(self, lang: str, k: int) -> Path:
        return self.work / "parts" / f"{lang}-p{k:05d}.json"

    @property
    def manifest(self) -> Path:
        return self.out / "manifest.json"

    @property
    def tokenizer(self) -> Path:
        return self.out / "tokenizer" / "tokenizer.model"


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------

def fingerprint(cfg: PrepareConfig, chunks: list[Chunk], strict: bool) -> str:
    """What the output depends on: the config (minus where work runs) and the inputs' identity."""
    c = to_dict(cfg)
    c.pop("dask", None)
    c.pop("keep_work", None)
    inputs = sorted({ch.path for ch in chunks})
    stat = [(p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in inputs]
    blob = json.dumps({"config": c, "inputs": stat, "strict": strict, "format": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def plan(cfg: PrepareConfig, paths: Paths, strict: bool = False) -> dict[str, Any]:
    """Cut the inputs into chunks and pin the run to its config; refuses a mismatched folder."""
    chunks = plan_chunks(cfg.sources, cfg.read)
    fp = fingerprint(cfg, chunks, strict)
    if paths.manifest.exists():
        m = read_json(paths.manifest)
        if m.get("fingerprint") != fp:
            raise DataError(f"{paths.out} already holds prepared data made from another config or other inputs; "
                            f"choose another --out or delete {paths.out}")
    plan_file = paths.work / "plan.json"
    if plan_file.exists():
        old = read_json(plan_file)
        if old["fingerprint"] != fp:
            raise DataError(f"{paths.out} holds an unfinished run with another config or other inputs; "
                            f"choose another --out, or delete {paths.work} to start over")
        return old
    paths.work.mkdir(parents=True, exist_ok=True)
    p = {"fingerprint": fp, "chunks": [c.to_dict() for c in chunks]}
    write_json_atomic(plan_file, p)
    return p


def is_complete(paths: Paths, fp: str) -> bool:
    return paths.manifest.exists() and read_json(paths.manifest).get("fingerprint") == fp


# ---------------------------------------------------------------------------------------------
# chunks: read → normalize → langid → quality → signatures
# ---------------------------------------------------------------------------------------------

CHUNK_SCHEMA = pa.schema([
    ("pos", pa.int64()), ("id", pa.string()), ("lang", pa.string()), ("text", pa.string()),
    ("exact", pa.uint64()), ("minhash", pa.list_(pa.uint32())),
])


def process_chunk(chunk: dict[str, Any], cfg: PrepareConfig, out: str, strict: bool = False) -> dict[str, Any]:
    """Run the per-document steps over one chunk; write kept docs (sorted by language)."""
    paths = Paths(Path(out))
    done = paths.chunk_done(chunk["id"])
    if done.exists():
        return read_json(done)
    t0 = time.perf_counter()
    ledger = Ledger()
    reader = ChunkReader(Chunk(**chunk), cfg.read, ledger, strict)
    steps = [Normalizer(ledger, strict)]
    if cfg.langid.enabled:
        steps.append(LanguageIdFilter(cfg.langid, ledger, strict))
    if cfg.filters.enabled:
        steps.append(QualityFilter(cfg.filters, ledger, strict))
    signer = DedupSigner(cfg.dedup, ledger)
    steps.append(signer)
    docs: Iterable[Document] = reader.run()
    for step in steps:
        docs = step.run(docs)
    kept = sorted(docs, key=lambda d: (d.lang, d.pos))
    cols = {
        "pos": [d.pos for d in kept], "id": [d.id for d in kept], "lang": [d.lang for d in kept],
        "text": [d.text for d in kept], "exact": [d.meta["exact"] for d in kept],
        "minhash": [d.meta["minhash"] if "minhash" in d.meta else None for d in kept],
    }
    table = pa.table(cols, schema=CHUNK_SCHEMA)
    data = paths.chunk_data(chunk["id"])
    data.parent.mkdir(parents=True, exist_ok=True)
    tmp = data.with_name(data.name + ".tmp-write")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, CHUNK_SCHEMA) as w:
        w.write_table(table, max_chunksize=4096)
    tmp.replace(data)
    ranges: dict[str, list[int]] = {}
    nbytes: dict[str, int] = {}
    for i, d in enumerate(kept):
        r = ranges.setdefault(d.lang, [i, i])
        r[1] = i + 1
        nbytes[d.lang] = nbytes.get(d.lang, 0) + len(d.text.encode("utf-8"))
    summary = {
        "id": chunk["id"], "ledger": ledger.to_dict(), "lang_ranges": ranges, "lang_bytes": nbytes,
        "steps": {"read": reader.report(), **{s.name: s.report() for s in steps}},
        "seconds": {"read": reader.seconds, **{s.name: s.seconds for s in steps}, "total": time.perf_counter() - t0},
    }
    write_json_atomic(done, summary)
    return summary


def _chunk_table(paths: Paths, cid: int, columns: list[str]) -> pa.Table:
    with pa.memory_map(str(paths.chunk_data(cid)), "r") as src:
        return pa.ipc.open_file(src).read_all().select(columns)


# ---------------------------------------------------------------------------------------------
# dedup: one ordered pass over all chunks
# ---------------------------------------------------------------------------------------------

def run_dedup(cfg: PrepareConfig, paths: Paths, chunk_ids: list[int]) -> dict[str, Any]:
    done = paths.work / "dedup.json"
    if done.exists():
        return read_json(done)
    dd = Deduplicator(cfg.dedup)
    dup_counts: dict[str, dict[str, int]] = {}
    kept_bytes: dict[tuple[int, str], int] = {}
    # For the validation split: per language, the count of docs, the count under the fraction,
    # the (valid_min_docs) smallest draws and the largest draw.
    n_docs: dict[str, int] = {}
    n_under: dict[str, int] = {}
    smallest: dict[str, list[float]] = {}
    largest: dict[str, float] = {}
    f, kmin = cfg.pack.valid_fraction, cfg.pack.valid_min_docs
    for cid in chunk_ids:
        t = _chunk_table(paths, cid, ["pos", "id", "lang", "text", "exact", "minhash"])
        order = np.argsort(t.column("pos").to_numpy(), kind="stable")
        pos = t.column("pos").to_numpy()
        ids = t.column("id").to_pylist()
        langs = t.column("lang").to_pylist()
        exact = t.column("exact").to_numpy()
        sizes = [len(s.encode("utf-8")) for s in t.column("text").to_pylist()] if t.num_rows else []
        mh = t.column("minhash")
        drops = []
        for i in order:
            sig = mh[int(i)].values.to_numpy() if cfg.dedup.near and mh[int(i)].is_valid else None
            kind = dd.check(int(exact[i]), sig) if (cfg.dedup.exact or cfg.dedup.near) else None
            lang = langs[i]
            if kind:
                drops.append([int(pos[i]), kind])
                c = dup_counts.setdefault(lang, {})
                c[kind] = c.get(kind, 0) + 1
                continue
            kept_bytes[(cid, lang)] = kept_bytes.get((cid, lang), 0) + sizes[i]
            u = _u(cfg.seed, "valid", ids[i], int(exact[i]))
            n_docs[lang] = n_docs.get(lang, 0) + 1
            n_under[lang] = n_under.get(lang, 0) + (u < f)
            sm = smallest.setdefault(lang, [])
            if len(sm) < kmin or u < sm[-1]:
                sm.append(u)
                sm.sort()
                del sm[kmin:]
            largest[lang] = max(largest.get(lang, 0.0), u)
        write_json_atomic(paths.chunk_drops(cid), drops)
    # Validation rule per language: the k docs with the smallest draws, where k is the count
    # under the fraction, raised to valid_min_docs and capped so training keeps one doc.
    split_rule: dict[str, list] = {}
    for lang, n in n_docs.items():
        k = n_under[lang]
        lo, hi = min(kmin, n - 1), n - 1
        if k < lo:
            split_rule[lang] = ["le", smallest[lang][lo - 1]]
        elif k > hi:
            split_rule[lang] = ["lt", largest[lang]]
        else:
            split_rule[lang] = ["lt", f]
    # Pack parts: per language, consecutive chunk slices of about part_bytes.
    parts: list[dict[str, Any]] = []
    chunk_stats = {cid: read_json(paths.chunk_done(cid)) for cid in chunk_ids}
    for lang in sorted(n_docs):
        cur: dict[str, Any] | None = None
        for cid in chunk_ids:
            rng = chunk_stats[cid]["lang_ranges"].get(lang)
            if not rng:
                continue
            b = kept_bytes.get((cid, lang), 0)
            if cur is None or cur["bytes"] >= cfg.pack.part_bytes:
                cur = {"lang": lang, "k": sum(p["lang"] == lang for p in parts), "slices": [], "bytes": 0,
                       "split_rule": split_rule[lang]}
                parts.append(cur)
            cur["slices"].append([cid, rng[0], rng[1]])
            cur["bytes"] += b
    lang_bytes: dict[str, int] = {}
    for (cid, lang), b in kept_bytes.items():
        lang_bytes[lang] = lang_bytes.get(lang, 0) + b
    result = {"duplicates": {k: dict(sorted(v.items())) for k, v in sorted(dup_counts.items())},
              "split_rule": dict(sorted(split_rule.items())), "parts": parts,
              "kept_docs": dict(sorted(n_docs.items())), "kept_bytes": dict(sorted(lang_bytes.items()))}
    write_json_atomic(done, result)
    return result


def _drops(paths: Paths, cid: int) -> set[int]:
    return {p for p, _ in read_json(paths.chunk_drops(cid))}


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def build_tokenizer(cfg: PrepareConfig, paths: Paths, dedup: dict[str, Any], chunk_ids: list[int]) -> dict[str, Any]:
    done = paths.work / "tokenizer.json"
    if done.exists() and paths.tokenizer.exists():
        return read_json(done)
    paths.tokenizer.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if cfg.tokenizer.model:
        src = Path(cfg.tokenizer.model)
        if not src.is_file():
            raise DataError(f"tokenizer.model not found: {src}")
        check_model(src)
        tmp = paths.tokenizer.with_name("tokenizer.model.tmp-copy")
        shutil.copyfile(src, tmp)
        tmp.replace(paths.tokenizer)
        info["trained"] = False
        info["source"] = str(src)
    else:
        weights = alpha_weights(dedup["kept_bytes"], cfg.tokenizer.alpha)
        budget = {lang: w * cfg.tokenizer.sample_bytes for lang, w in weights.items()}
        rate = {lang: min(1.0, budget[lang] / b) for lang, b in dedup["kept_bytes"].items() if b}
        sample = paths.work / "tokenizer_sample.txt"
        taken: dict[str, int] = {}
        with open(sample, "w", encoding="utf-8") as f:
            for cid in chunk_ids:
                drops = _drops(paths, cid)
                t = _chunk_table(paths, cid, ["pos", "id", "lang", "text", "exact"])
                for pos, did, lang, text, ex in zip(*(t.column(c).to_pylist() for c in ("pos", "id", "lang", "text", "exact"))):
                    if pos in drops or _u(cfg.seed, "tok", did, ex) >= rate.get(lang, 0.0):
                        continue
                    if cfg.pii.enabled:
                        text, _ = redact(text, cfg.pii.kinds)
                    for line in sample_lines(text):
                        f.write(line + "\n")
                    taken[lang] = taken.get(lang, 0) + len(text.encode("utf-8"))
        import os
        threads = cfg.tokenizer.num_threads or len(os.sched_getaffinity(0))
        prefix = paths.work / "tok" / "tokenizer"
        prefix.parent.mkdir(parents=True, exist_ok=True)
        model = train(sample, prefix, cfg.tokenizer.vocab_size, cfg.tokenizer.character_coverage, threads, cfg.seed)
        tmp = paths.tokenizer.with_name("tokenizer.model.tmp-copy")
        shutil.copyfile(model, tmp)
        tmp.replace(paths.tokenizer)
        vocab = prefix.with_suffix(".vocab")
        if vocab.exists():
            shutil.copyfile(vocab, paths.tokenizer.with_suffix(".vocab"))
        info["trained"] = True
        info["sample_bytes"] = dict(sorted(taken.items()))
        info["sample_weights"] = {k: round(v, 6) for k, v in weights.items()}
    info["vocab_size"] = check_model(paths.tokenizer)
    info["sha256"] = sha256_file(paths.tokenizer)
    info["seconds"] = time.perf_counter() - t0
    write_json_atomic(done, info)
    return info


# ---------------------------------------------------------------------------------------------
# pack: PII → tokenize → best-fit pack → shards
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=2)
def _sp(path: str, sha: str):
    import sentencepiece as spm

    # One thread: parallelism comes from one Dask worker process per core. SentencePiece's
    # default (-1 = every core, per call) oversubscribes the machine N-fold.
    return spm.SentencePieceProcessor(model_file=path, num_threads=1)


def shard_path(split: str, lang: str, bucket: int, k: int) -> str:
    return f"shards/{split}/{lang}/{lang}-b{bucket:05d}-p{k:05d}.arrow"


def pack_part(part: dict[str, Any], cfg: PrepareConfig, out: str, tok_sha: str) -> dict[str, Any]:
    paths = Paths(Path(out))
    lang, k = part["lang"], part["k"]
    done = paths.part_done(lang, k)
    if done.exists():
        return read_json(done)
    sp = _sp(str(paths.tokenizer), tok_sha)
    eos = sp.eos_id()
    rule, thr = part["split_rule"]
    ledger = Ledger()
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
                w = writers[(split, s.bucket)] = ShardWriter(paths.out / shard_path(split, lang, s.bucket, k), lang, s.bucket, split)
            w.add(s)
        secs["write"] += time.perf_counter() - t

    def run_batch(split: str, texts: list[str]) -> None:
        t = time.perf_counter()
        encoded = sp.encode(texts)
        secs["tokenize"] += time.perf_counter() - t
        for text, ids in zip(texts, encoded):
            ids.append(eos)
            arr = np.asarray(ids, dtype=np.int32)
            ledger.keep(lang, len(text.encode("utf-8")), len(arr))
            t = time.perf_counter()
            samples = packers[split].add(arr)
            secs["pack"] += time.perf_counter() - t
            if samples:
                emit(split, samples)

    try:
        batches: dict[str, list[str]] = {"train": [], "valid": []}
        for cid, start, end in part["slices"]:
            drops = _drops(paths, cid)
            t = _chunk_table(paths, cid, ["pos", "id", "text", "exact"]).slice(start, end - start)
            for pos, did, text, ex in zip(*(t.column(c).to_pylist() for c in ("pos", "id", "text", "exact"))):
                if pos in drops:
                    continue
                u = _u(cfg.seed, "valid", did, ex)
                split = "valid" if (u < thr if rule == "lt" else u <= thr) else "train"
                if cfg.pii.enabled:
                    tp = time.perf_counter()
                    text, counts = redact(text, cfg.pii.kinds)
                    secs["pii"] += time.perf_counter() - tp
                    for kind, n in counts.items():
                        pii_counts[kind] = pii_counts.get(kind, 0) + n
                        ledger.pii(lang, kind, n)
                docs[split] += 1
                batches[split].append(text)
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
            shards.append({"path": shard_path(split, lang, bucket, k), "split": split, "bucket": bucket,
                           "lang": lang, **info})
        secs["write"] += time.perf_counter() - t
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    result = {"lang": lang, "k": k, "shards": shards, "ledger": ledger.to_dict(), "docs": docs,
              "pii": dict(sorted(pii_counts.items())), "seconds": secs}
    write_json_atomic(done, result)
    return result


# ---------------------------------------------------------------------------------------------
# manifest
# ---------------------------------------------------------------------------------------------

def blend_weights(cfg: PrepareConfig, train_tokens: dict[str, int]) -> dict[str, float]:
    present = {k: v for k, v in train_tokens.items() if v > 0}
    if cfg.blend.weights:
        w = {languages.resolve(k): v for k, v in cfg.blend.weights.items()}
        missing = sorted(k for k in w if k not in present and w[k] > 0)
        if missing:
            raise DataError(f"blend.weights names {missing}, which have no training data")
        z = sum(w.get(k, 0.0) for k in present)
        if z <= 0:
            raise DataError("blend.weights gives no weight to any language with training data")
        return {k: round(w.get(k, 0.0) / z, 8) for k in sorted(present)}
    return {k: round(v, 8) for k, v in alpha_weights(present, cfg.blend.alpha).items()}


def write_manifest(cfg: PrepareConfig, paths: Paths, plan_: dict[str, Any], chunk_summaries: list[dict],
                   dedup: dict[str, Any], tok: dict[str, Any], part_results: list[dict]) -> dict[str, Any]:
    ledger = Ledger()
    for s in chunk_summaries:
        ledger.merge(s["ledger"])
    for lang, kinds in dedup["duplicates"].items():
        for kind, n in kinds.items():
            for _ in range(n):
                ledger.drop(lang, "duplicates", kind)
    for r in part_results:
        ledger.merge(r["ledger"])
    bad = ledger.check_balance()
    if bad:
        raise RuntimeError("ledger does not balance (a bug): " + "; ".join(bad))
    shards = sorted((s for r in part_results for s in r["shards"]), key=lambda s: s["path"])
    train_tokens: dict[str, int] = {}
    split_totals: dict[str, dict[str, int]] = {}
    for s in shards:
        if s["split"] == "train":
            train_tokens[s["lang"]] = train_tokens.get(s["lang"], 0) + s["tokens"]
        t = split_totals.setdefault(s["split"], {"rows": 0, "tokens": 0, "bucket_tokens": 0})
        t["rows"] += s["rows"]
        t["tokens"] += s["tokens"]
        t["bucket_tokens"] += s["rows"] * s["bucket"]
    for t in split_totals.values():
        t["padding_fraction"] = round(1 - t["tokens"] / t["bucket_tokens"], 6) if t["bucket_tokens"] else 0.0
    langs = ledger.to_dict()
    for r in part_results:
        e = langs[r["lang"]]
        e["valid_docs"] = e.get("valid_docs", 0) + r["docs"]["valid"]
    for lang, e in langs.items():
        e.setdefault("valid_docs", 0)
        e["train_tokens"] = train_tokens.get(lang, 0)
        if lang in languages.BY_CODE:
            e["name"] = languages.BY_CODE[lang].name
    steps = merge_reports(s["steps"] for s in chunk_summaries)
    steps["dedup"] = {"duplicates": merge_reports(dedup["duplicates"].values()), "docs_out": sum(dedup["kept_docs"].values())}
    steps["pii"] = merge_reports(r["pii"] for r in part_results)
    sp_vocab = tok["vocab_size"]
    manifest = {
        "format_version": FORMAT_VERSION,
        "created_by": f"bloomline {bloomline.__version__}",
        "fingerprint": plan_["fingerprint"],
        "tokenizer": {"path": "tokenizer/tokenizer.model", "vocab_size": sp_vocab, "sha256": tok["sha256"],
                      "trained": tok["trained"], "eos_id": 2, "pad_id": 3, "bos_id": 1, "unk_id": 0},
        "buckets": list(cfg.pack.buckets),
        "seq_len": cfg.pack.seq_len,
        "shards": shards,
        "splits": split_totals,
        "blend": blend_weights(cfg, train_tokens),
        "languages": langs,
        "totals": {**ledger.totals(), "input_records": sum(e["docs_in"] for e in langs.values())},
        "stages": steps,
        "inputs": sorted({c["path"] for c in plan_["chunks"]}),
        "seed": cfg.seed,
        "config": to_dict(cfg),
    }
    if tok.get("trained"):
        manifest["tokenizer"]["sample_weights"] = tok["sample_weights"]
    _sp_ids = _sp(str(paths.tokenizer), tok["sha256"])
    for key, fn in (("eos_id", _sp_ids.eos_id), ("pad_id", _sp_ids.pad_id), ("bos_id", _sp_ids.bos_id), ("unk_id", _sp_ids.unk_id)):
        manifest["tokenizer"][key] = int(fn())
    manifest["config"].pop("dask", None)
    write_json_atomic(paths.manifest, manifest)
    return manifest


def clean_work(paths: Paths) -> None:
    shutil.rmtree(paths.work, ignore_errors=True)


def prepare_start(paths: Paths) -> None:
    paths.out.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(paths.out)


# ---------------------------------------------------------------------------------------------
# the whole sequence
# ---------------------------------------------------------------------------------------------

class Progress:
    """What the driver reports to; the CLI's implementation draws rich progress bars."""

    def start(self, stage: str, total: int, unit: str) -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def finish(self, stage: str, message: str) -> None: ...


def _stage_direct(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def run_all(cfg: PrepareConfig, out: str | Path, strict: bool = False, map_fn: MapFn = serial_map,
            stage: Callable[..., Any] = _stage_direct, progress: Progress | None = None) -> dict[str, Any]:
    """Run (or resume) every stage; returns the manifest plus ``run_stats`` (timings).

    ``stage(name, fn, *args)`` runs one coarse stage (the Prefect flow makes each a task);
    ``map_fn(func, items)`` runs the fine-grained parallel work (Dask in the flow) and yields
    results as they complete.
    """
    from functools import partial

    progress = progress or Progress()
    paths = Paths(Path(out).resolve())
    prepare_start(paths)
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    p = stage("plan", plan, cfg, paths, strict)
    if is_complete(paths, p["fingerprint"]):
        m = read_json(paths.manifest)
        m["run_stats"] = {"already_complete": True}
        return m
    chunk_ids = [c["id"] for c in p["chunks"]]

    def chunks_stage() -> list[dict]:
        t = time.perf_counter()
        progress.start("read+filter", sum(c["size"] for c in p["chunks"]), "B")
        sizes = {c["id"]: c["size"] for c in p["chunks"]}
        res = []
        for r in map_fn(partial(process_chunk, cfg=cfg, out=str(paths.out), strict=strict), p["chunks"]):
            res.append(r)
            progress.advance("read+filter", sizes[r["id"]])
        res.sort(key=lambda r: r["id"])
        dt = time.perf_counter() - t
        recs = sum(r["steps"]["read"]["records"] for r in res)
        timings["chunks"] = {"seconds": dt, "records": recs, "docs_per_s": recs / dt if dt else None}
        progress.finish("read+filter", f"{recs} records in {dt:.1f} s ({recs / max(dt, 1e-9):,.0f} docs/s)")
        return res

    summaries = stage("read_filter", chunks_stage)

    def dedup_stage() -> dict:
        t = time.perf_counter()
        progress.start("dedup", len(chunk_ids), "chunks")
        d = run_dedup(cfg, paths, chunk_ids)
        dt = time.perf_counter() - t
        n = sum(sum(v.values()) for v in d["duplicates"].values())
        timings["dedup"] = {"seconds": dt, "duplicates": n}
        progress.finish("dedup", f"{n} duplicates removed in {dt:.1f} s")
        return d

    dedup = stage("dedup", dedup_stage)

    def tokenizer_stage() -> dict:
        progress.start("tokenizer", 1, "model")
        tok = build_tokenizer(cfg, paths, dedup, chunk_ids)
        timings["tokenizer"] = {"seconds": tok.get("seconds")}
        progress.finish("tokenizer", f"{'trained' if tok['trained'] else 'reused'} tokenizer, vocab {tok['vocab_size']}")
        return tok

    tok = stage("tokenizer", tokenizer_stage)

    def pack_stage() -> list[dict]:
        t = time.perf_counter()
        # Largest parts first (LPT scheduling): the stage ends when its last part does.
        parts = sorted(dedup["parts"], key=lambda x: -x["bytes"])
        progress.start("tokenize+pack", sum(x["bytes"] for x in parts), "B")
        sizes = {(x["lang"], x["k"]): x["bytes"] for x in parts}
        res = []
        for r in map_fn(partial(pack_part, cfg=cfg, out=str(paths.out), tok_sha=tok["sha256"]), parts):
            res.append(r)
            progress.advance("tokenize+pack", sizes[(r["lang"], r["k"])])
        res.sort(key=lambda r: (r["lang"], r["k"]))
        dt = time.perf_counter() - t
        tokens = sum(s["tokens"] for r in res for s in r["shards"])
        timings["pack"] = {"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt if dt else None}
        progress.finish("tokenize+pack", f"{tokens:,} tokens in {dt:.1f} s ({tokens / max(dt, 1e-9):,.0f} tokens/s)")
        return res

    part_results = stage("tokenize_pack", pack_stage)
    manifest = stage("manifest", write_manifest, cfg, paths, p, summaries, dedup, tok, part_results)
    timings["total_seconds"] = time.perf_counter() - t0
    write_json_atomic(paths.out / "run_stats.json", timings)
    if not cfg.keep_work:
        clean_work(paths)
    manifest = dict(manifest)
    manifest["run_stats"] = timings
    return manifest
