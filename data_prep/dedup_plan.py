"""The dedup stage, and the two decisions that need the whole deduplicated corpus at once.

One sequential pass over all chunks in input order does three things, which is why they share a
stage (and one marker, ``DIR/.work/dedup.json``):

1. :func:`dedup_pass`: exact and near duplicates (``data_prep/dedup.py``); the first occurrence
   is kept; each chunk's dropped positions go to ``DIR/.work/dedup/cNNNNN.json``.
2. :func:`validation_rules`: which kept documents form each language's validation split
   (``data_prep/FORMAT.md``, "Validation split"), from the documents' seeded draws.
3. :func:`plan_parts`: how each language's kept documents are cut into pack parts, the unit of
   parallel work of the pack stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bloomline.io import read_json, write_json_atomic
from data_prep.chunks import chunk_table
from data_prep.config import PrepareConfig
from data_prep.dedup import Deduplicator
from data_prep.document import uniform_draw
from data_prep.droplog import DROP_SCHEMA, dropped_path, write_rows
from data_prep.workdir import Paths


@dataclass
class SplitDraws:
    """What the validation rule of one language needs of its kept documents' draws."""

    docs: int = 0
    under: int = 0
    """Documents whose draw is below the validation fraction."""
    smallest: list[float] = field(default_factory=list)
    """The ``valid_min_docs`` smallest draws, ascending."""
    largest: float = 0.0

    def add(self, u: float, fraction: float, keep: int) -> None:
        self.docs += 1
        self.under += u < fraction
        if keep and (len(self.smallest) < keep or u < self.smallest[-1]):
            self.smallest.append(u)
            self.smallest.sort()
            del self.smallest[keep:]
        self.largest = max(self.largest, u)


@dataclass
class DedupResult:
    duplicates: dict[str, dict[str, int]]
    """Per language, drops by kind (exact, near)."""
    kept_bytes: dict[tuple[int, str], int]
    """UTF-8 bytes kept per (chunk, language)."""
    draws: dict[str, SplitDraws]


def dedup_pass(cfg: PrepareConfig, paths: Paths, chunk_ids: list[int]) -> DedupResult:
    """Decide duplicates over all chunks in input order; write each chunk's drops."""
    dd = Deduplicator(cfg.dedup)
    res = DedupResult({}, {}, {})
    logged: dict[int, list[dict[str, Any]]] = {}  # chunk -> drop-log rows, duplicate_of still a ref
    for cid in chunk_ids:
        t = chunk_table(paths, cid, ["pos", "id", "loc", "lang", "text", "exact", "minhash"])
        pos = t.column("pos").to_numpy()
        order = np.argsort(pos, kind="stable")
        ids = t.column("id").to_pylist()
        langs = t.column("lang").to_pylist()
        exact = t.column("exact").to_numpy()
        texts = t.column("text").to_pylist()
        sizes = [len(s.encode("utf-8")) for s in texts]
        mh = t.column("minhash")
        drops = []
        for i in order:
            sig = mh[int(i)].values.to_numpy() if cfg.dedup.near and mh[int(i)].is_valid else None
            # ref: chunk and input position, resolved to the kept document's id after the pass
            found = dd.check(int(exact[i]), sig, ref=(cid << 32) | int(pos[i])) if (cfg.dedup.exact or cfg.dedup.near) else None
            lang = langs[i]
            if found:
                kind, of, similarity = found
                drops.append([int(pos[i]), kind])
                c = res.duplicates.setdefault(lang, {})
                c[kind] = c.get(kind, 0) + 1
                logged.setdefault(cid, []).append(
                    {"id": ids[i], "source": t.column("loc")[int(i)].as_py(), "lang": lang, "stage": "dedup",
                     "outcome": "duplicates", "reason": kind, "score": similarity,
                     "threshold": 1.0 if kind == "exact" else cfg.dedup.threshold, "duplicate_of": of,
                     "text": texts[i][:cfg.dropped_text_chars] if cfg.dropped_text_chars else None})
                continue
            res.kept_bytes[(cid, lang)] = res.kept_bytes.get((cid, lang), 0) + sizes[i]
            u = uniform_draw(cfg.seed, "valid", ids[i], int(exact[i]))
            res.draws.setdefault(lang, SplitDraws()).add(u, cfg.pack.valid_fraction, cfg.pack.valid_min_docs)
        write_json_atomic(paths.chunk_drops(cid), drops)
    write_duplicate_log(paths, logged)
    return res


def write_duplicate_log(paths: Paths, logged: dict[int, list[dict[str, Any]]]) -> None:
    """``DIR/dropped/dedup-cNNNNNN.parquet``: each duplicate with the id of the document it duplicates."""
    refs: dict[int, set[int]] = {}
    for rows in logged.values():
        for r in rows:
            refs.setdefault(r["duplicate_of"] >> 32, set()).add(r["duplicate_of"] & 0xFFFFFFFF)
    id_of: dict[int, str] = {}
    for cid, wanted in refs.items():
        t = chunk_table(paths, cid, ["pos", "id"])
        for p, i in zip(t.column("pos").to_pylist(), t.column("id").to_pylist()):
            if p in wanted:
                id_of[(cid << 32) | p] = i
    for cid, rows in logged.items():
        for r in rows:
            r["duplicate_of"] = id_of[r["duplicate_of"]]
        write_rows(dropped_path(paths.out, "dedup", cid), rows, DROP_SCHEMA)


def validation_rules(draws: dict[str, SplitDraws], fraction: float, min_docs: int) -> dict[str, list]:
    """Per language ``[op, threshold]``: a kept document is held out when ``draw op threshold``.

    The held-out documents are the k with the smallest draws, where k is the count under the
    fraction, raised to ``min_docs`` and capped so that training keeps at least one document."""
    rules: dict[str, list] = {}
    for lang, d in draws.items():
        lo, hi = min(min_docs, d.docs - 1), d.docs - 1
        if d.under < lo:
            rules[lang] = ["le", d.smallest[lo - 1]]
        elif d.under > hi:
            rules[lang] = ["lt", d.largest]
        else:
            rules[lang] = ["lt", fraction]
    return rules


def plan_parts(paths: Paths, chunk_ids: list[int], kept_bytes: dict[tuple[int, str], int],
               rules: dict[str, list], part_bytes: int) -> list[dict[str, Any]]:
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
                cur = {"lang": lang, "k": sum(p["lang"] == lang for p in parts), "slices": [], "bytes": 0,
                       "split_rule": rules[lang]}
                parts.append(cur)
            cur["slices"].append([cid, rng[0], rng[1]])
            cur["bytes"] += kept_bytes.get((cid, lang), 0)
    return parts


def run_dedup(cfg: PrepareConfig, paths: Paths, chunk_ids: list[int]) -> dict[str, Any]:
    """The stage: the pass, the validation rules and the part plan, marked done by dedup.json."""
    done = paths.work / "dedup.json"
    if done.exists():
        return read_json(done)
    res = dedup_pass(cfg, paths, chunk_ids)
    rules = validation_rules(res.draws, cfg.pack.valid_fraction, cfg.pack.valid_min_docs)
    parts = plan_parts(paths, chunk_ids, res.kept_bytes, rules, cfg.pack.part_bytes)
    lang_bytes: dict[str, int] = {}
    for (_, lang), b in res.kept_bytes.items():
        lang_bytes[lang] = lang_bytes.get(lang, 0) + b
    result = {"duplicates": {k: dict(sorted(v.items())) for k, v in sorted(res.duplicates.items())},
              "split_rule": dict(sorted(rules.items())), "parts": parts,
              "kept_docs": dict(sorted((k, d.docs) for k, d in res.draws.items())),
              "kept_bytes": dict(sorted(lang_bytes.items()))}
    write_json_atomic(done, result)
    return result
