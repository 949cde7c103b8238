"""The per-document side of deduplication: an exact key, a MinHash signature, and its LSH band keys.

* Exact: xxh64 of the text lower-cased with whitespace, punctuation and symbols removed.
* Near: MinHash (datasketch; ``num_perm`` permutations) of the set of word ``shingle_words``-grams
  (character n-grams for Han text). A document with no shingle (no word at all) has no signature
  and takes part in exact deduplication only.
* Bands: the signature cut into ``b`` bands of ``r`` values, (b, r) chosen for the Jaccard
  ``threshold`` as datasketch's MinHashLSH chooses them (equal weight on false positives and false
  negatives); each band hashed to 64 bits. Two documents are candidates when any band key is equal.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import numpy as np
import xxhash
from datasketch import MinHash

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


def minhash(text: str, cfg: DedupConfig, han: bool, seed: int = 1) -> np.ndarray | None:
    """The signature (``num_perm`` uint32), or None when the text has no shingle."""
    sh = shingles(text, cfg.shingle_words, han)
    if not sh:
        return None
    m = MinHash(num_perm=cfg.num_perm, seed=seed, hashfunc=_hash32, scheme="affine32")
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


@lru_cache(maxsize=16)
def band_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) with b·r ≤ num_perm minimising the false-positive plus false-negative
    probability mass around ``threshold`` (datasketch ``MinHashLSH``'s choice, weights 0.5/0.5)."""
    from scipy.integrate import quad

    best, cost = (1, 1), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = quad(lambda s: 1 - (1 - s**r) ** b, 0.0, threshold)[0]
            fn = quad(lambda s: 1 - (1 - (1 - s**r) ** b), threshold, 1.0)[0]
            if 0.5 * fp + 0.5 * fn < cost:
                best, cost = (b, r), 0.5 * fp + 0.5 * fn
    return best


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (a bijection that spreads every input bit)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """64-bit key of each band of each signature: ``[n, bands]`` uint64 from ``[n, num_perm]`` uint32.

    Equal bands give equal keys; a collision between different bands (2⁻⁶⁴) only adds a candidate,
    which the pairwise check then rejects."""
    n = len(sigs)
    keys = np.empty((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(bands):
            h = np.full(n, j + 1, dtype=np.uint64)
            for col in range(j * rows, (j + 1) * rows):
                h = mix64(h ^ sigs[:, col].astype(np.uint64))
            keys[:, j] = h
    return keys
