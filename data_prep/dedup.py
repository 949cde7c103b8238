"""Deduplication across the whole corpus: exact (normalized hash) and near (MinHash LSH).

Signatures are computed per chunk in parallel (:class:`DedupSigner`, part of the chunk step);
the decision is one sequential pass over all chunks in input order (:class:`Deduplicator`), so
the first occurrence is kept and the result does not depend on how work was scheduled.

* Exact: xxh64 of the text lower-cased with whitespace, punctuation and symbols removed.
* Near: MinHash (datasketch; ``num_perm`` permutations) of the set of word ``shingle_words``-grams
  (character n-grams for Han text). datasketch's LSH picks bands/rows for the Jaccard
  ``threshold``; every LSH candidate is confirmed by its estimated Jaccard ≥ threshold.

Memory of the decision pass is O(documents): one 8-byte hash and one LSH entry per band per
kept document. That is the price of deduplicating across the whole corpus in one place.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import xxhash
from datasketch import LeanMinHash, MinHash, MinHashLSH

from bloomline import languages
from data_prep.config import DedupConfig
from data_prep.document import Document, Ledger
from data_prep.step import PipelineStep
from data_prep.text import is_han, is_punct_or_symbol, strip_edges


def exact_key(text: str) -> int:
    """xxh64 of the text lower-cased without punctuation, symbols, separators and controls."""
    kept = "".join(ch for ch in text.lower() if unicodedata.category(ch)[0] not in "PSZC")
    return xxhash.xxh64_intdigest(kept.encode("utf-8"))


def shingle_words(text: str) -> list[str]:
    """Lower-cased whitespace-separated words with punctuation/symbols stripped from their ends
    (digits kept: "room 101" and "room 102" are different documents)."""
    return [w for w in (strip_edges(w, is_punct_or_symbol) for w in text.lower().split()) if w]


def shingles(text: str, n: int, han: bool) -> set[bytes]:
    if han:
        chars = [c for c in text if is_han(c) or c.isalnum()]
        grams = {"".join(chars[i : i + n]) for i in range(max(1, len(chars) - n + 1))}
    else:
        ws = shingle_words(text)
        grams = {" ".join(ws[i : i + n]) for i in range(max(1, len(ws) - n + 1))}
    return {g.encode("utf-8") for g in grams if g}


def _hash32(b: bytes) -> int:
    return xxhash.xxh32_intdigest(b)


def minhash(text: str, cfg: DedupConfig, han: bool, seed: int = 1) -> np.ndarray:
    m = MinHash(num_perm=cfg.num_perm, seed=seed, hashfunc=_hash32, scheme="affine32")
    sh = shingles(text, cfg.shingle_words, han)
    if sh:
        m.update_batch(list(sh))
    return m.hashvalues.astype(np.uint32)


class DedupSigner(PipelineStep):
    """Adds ``exact`` and ``minhash`` to each document's meta (drops nothing)."""

    name = "dedup_sign"

    def __init__(self, cfg: DedupConfig, ledger: Ledger):
        super().__init__(ledger)
        self.cfg = cfg

    def process(self, doc: Document) -> Document:
        doc.meta["exact"] = exact_key(doc.text)
        if self.cfg.near:
            han = languages.BY_CODE[doc.lang].script in ("Hans", "Hant")
            doc.meta["minhash"] = minhash(doc.text, self.cfg, han)
        return doc


class Deduplicator:
    """Sequential decision pass. Feed documents in input order, each with an integer ``ref`` of
    the caller's choosing (the dedup stage packs chunk and position); get None (keep) or
    ``(kind, ref of the kept document it duplicates, similarity)``. Refs, not ids, are held, so
    memory stays one integer per kept document."""

    def __init__(self, cfg: DedupConfig, seed: int = 1):
        self.cfg = cfg
        self.seed = seed
        self.seen: dict[int, int] = {}  # exact hash -> ref of the first document with it
        self.lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm) if cfg.near else None
        # Signatures of inserted documents, one row each (4 bytes per permutation), and their ids.
        self._sigs = np.empty((1024, cfg.num_perm), dtype=np.uint32)
        self._refs = np.empty(1024, dtype=np.int64)
        self._n = 0

    def check(self, exact: int, signature: np.ndarray | None, ref: int = 0) -> tuple[str, int, float] | None:
        if self.cfg.exact and exact in self.seen:
            return "exact", self.seen[exact], 1.0
        if self.lsh is not None and signature is not None:
            m = LeanMinHash(seed=self.seed, hashvalues=signature.astype(np.uint64), scheme="affine32")
            # Confirm each candidate: estimated Jaccard = share of equal signature slots; the
            # earliest kept document that passes is the one reported.
            for key in sorted(self.lsh.query(m)):
                similarity = float(np.mean(self._sigs[key] == signature))
                if similarity >= self.cfg.threshold:
                    return "near", int(self._refs[key]), similarity
            if self._n == len(self._sigs):
                self._sigs = np.concatenate([self._sigs, np.empty_like(self._sigs)])
                self._refs = np.concatenate([self._refs, np.empty_like(self._refs)])
            self._sigs[self._n] = signature
            self._refs[self._n] = ref
            self.lsh.insert(self._n, m, check_duplication=False)
            self._n += 1
        if self.cfg.exact:
            self.seen.setdefault(exact, ref)
        return None
