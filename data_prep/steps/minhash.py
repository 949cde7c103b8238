"""The per-document side of deduplication: an exact key, a MinHash signature, and its LSH band keys.

* Exact: xxh64 of the text lower-cased with whitespace, punctuation and symbols removed.
* Near: MinHash (datasketch; ``num_perm`` permutations) of the set of word ``shingle_words``-grams
  (character n-grams in a script written without spaces: Chinese, Japanese, Thai, Lao, Khmer,
  Burmese, Tibetan, data_prep/steps/text.py ``UNSPACED_SCRIPTS``: a Thai line is one "word", and
  its word shingles would tell a changed letter from a new document not at all). A document with no shingle (no word at all) has no signature
  and takes part in exact deduplication only.
* Bands: the signature cut into ``b`` bands of ``r`` values, (b, r) chosen for the Jaccard
  ``threshold`` as datasketch's MinHashLSH chooses them (equal weight on false positives and false
  negatives); each band hashed to 64 bits. Two documents are candidates when any band key is equal.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain
from typing import Iterable

import numpy as np
import xxhash

from bloomline import languages
from data_prep.config import DedupConfig
from data_prep.steps.document import Document, Ledger
from data_prep.steps.step import BatchStep
from data_prep.steps.text import (
    UNSPACED_SCRIPTS,
    codepoints,
    from_codepoints,
    is_han,
    punct_or_symbol_chars,
    strip_edges,
    unkept_table,
)
from data_prep.steps.xxh32 import xxh32_slices


def exact_key(text: str) -> int:
    """xxh64 of the text lower-cased without punctuation, symbols, separators and controls."""
    cps = codepoints(text.lower())
    return xxhash.xxh64_intdigest(from_codepoints(cps[~unkept_table()[cps]]).encode("utf-8", "surrogatepass"))


def shingle_words(text: str) -> list[str]:
    """Lower-cased whitespace-separated words with punctuation/symbols stripped from their ends
    (digits kept: "room 101" and "room 102" are different documents)."""
    out = []
    ps = punct_or_symbol_chars()
    edge = ps.__contains__
    for w in text.lower().split():
        if w[0] in ps or w[-1] in ps:  # most words have clean edges: no strip call
            w = strip_edges(w, edge)
            if not w:
                continue
        out.append(w)
    return out


def _units(text: str, han: bool) -> list[str]:
    """What a shingle is made of: the words (:func:`shingle_words`), or for text written without
    spaces its letters and digits (Han, kana, Thai…: their letters are alphanumeric)."""
    return [c for c in text if is_han(c) or c.isalnum()] if han else shingle_words(text)


def _grams(text: str, n: int, han: bool) -> Iterable[str]:
    """Every shingle of the text, in order, repeats included (none for a text without words)."""
    units, sep = _units(text, han), "" if han else " "
    if len(units) < n:
        return [sep.join(units)] if units else []
    return map(sep.join, zip(*(units[k:] for k in range(n))))


def shingles(text: str, n: int, han: bool) -> set[bytes]:
    """The set of shingles: word n-grams (character n-grams for Han text), UTF-8."""
    return {g.encode("utf-8") for g in _grams(text, n, han)}


def shingle_hashes(texts: list[str], n: int, hans: list[bool]) -> list[np.ndarray]:
    """For each text, xxh32 of each of its shingles' UTF-8 (:func:`shingles`), in order, repeats
    included (a minimum does not see them, and a set would cost more than hashing them again).

    A shingle is ``n`` consecutive units joined (by a space between words), so in the string of
    a text's units joined the same way it is one contiguous slice: the texts' joined units are
    encoded once, and every slice is hashed together (data_prep/steps/xxh32.py)."""
    units = [_units(t, h) for t, h in zip(texts, hans)]
    seps = ["" if h else " " for h in hans]
    # every unit followed by its text's separator, the last one's too: a unit starts where the
    # one before it and its separator end (a slice never reaches its text's trailing separator)
    joined = "".join(s.join(u) + s for u, s in zip(units, seps) if u)
    counts = np.fromiter(map(len, units), dtype=np.int64, count=len(units))
    size = np.fromiter(map(len, chain.from_iterable(units)), dtype=np.int64, count=int(counts.sum()))
    step = size + np.repeat(np.fromiter(map(len, seps), dtype=np.int64, count=len(seps)), counts)
    start = np.cumsum(step) - step  # each unit's first character in ``joined``
    grams = np.where(counts > 0, np.maximum(counts - n + 1, 1), 0)  # fewer units than n: one shingle
    # a shingle's first unit: its index within its text plus its text's first unit
    first = np.arange(int(grams.sum())) + np.repeat(np.cumsum(counts) - counts - (np.cumsum(grams) - grams), grams)
    last = first + np.repeat(np.minimum(counts, n) - 1, grams)
    # characters -> UTF-8 bytes
    cp = codepoints(joined)
    width = 1 + (cp >= 0x80).astype(np.int64) + (cp >= 0x800) + (cp >= 0x10000)
    byte = np.concatenate(([0], np.cumsum(width)))
    b0, b1 = byte[start[first]], byte[start[last] + size[last]]
    hashes = xxh32_slices(np.frombuffer(joined.encode("utf-8"), dtype=np.uint8), b0, b1 - b0)
    return np.split(hashes, np.cumsum(grams)[:-1])


class MinHasher:
    """MinHash signatures of many documents at once, equal to datasketch's ``MinHash(num_perm,
    seed, scheme="affine32", hashfunc=xxh32)`` fed each document's shingles (the permutations are
    datasketch's own). datasketch hashes one document per call, a numpy pass of a few µs per
    shingle row; here the shingle hashes of a whole batch go through the permutations and a
    per-document minimum in cache-sized blocks (~100 MB/s, against ~4 per core)."""

    BLOCK = 4096
    """Shingles per block: [num_perm, BLOCK] uint32 is 2 MiB at 128 permutations, within L2."""

    def __init__(self, num_perm: int, seed: int = 1):
        # here, not at the top: datasketch imports scipy (0.9 s), which every command that imports
        # the pipeline would pay; only the processes that hash documents need it
        from datasketch import MinHash

        perms = MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
        self.a, self.b = (p.astype(np.uint32)[:, None] for p in perms)
        self.num_perm = num_perm

    def signatures(self, hashes: list[np.ndarray]) -> np.ndarray:
        """``[len(hashes), num_perm]`` uint32: the signature of each document's shingle hashes
        (each non-empty)."""
        lens = np.fromiter(map(len, hashes), dtype=np.int64, count=len(hashes))
        offs = np.concatenate(([0], np.cumsum(lens)))
        h = _fmix32(np.concatenate(hashes)) if hashes else np.empty(0, np.uint32)
        out = np.empty((self.num_perm, len(hashes)), dtype=np.uint32)
        i = 0
        while i < len(hashes):
            if lens[i] > self.BLOCK:  # a long document alone, block by block
                out[:, i] = self._min(h[offs[i] : offs[i + 1]])
                i += 1
                continue
            j = i + 1  # documents i..j-1 fill one block
            while j < len(hashes) and offs[j + 1] - offs[i] <= self.BLOCK:
                j += 1
            out[:, i:j] = np.minimum.reduceat(self._permuted(h[offs[i] : offs[j]]), offs[i:j] - offs[i], axis=1)
            i = j
        return out.T.copy()

    def _permuted(self, h: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            p = h[None, :] * self.a  # uint32 wraps: the affine map mod 2³², as datasketch's
            p += self.b
        return p

    def _min(self, h: np.ndarray) -> np.ndarray:
        m = np.full(self.num_perm, np.iinfo(np.uint32).max, dtype=np.uint32)
        for k in range(0, len(h), self.BLOCK):
            np.minimum(m, self._permuted(h[k : k + self.BLOCK]).min(axis=1), out=m)
        return m


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, which datasketch's affine32 scheme applies to each input
    hash before the permutations (its ``_fmix``; the constants are MurmurHash3's)."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))


@lru_cache(maxsize=8)
def minhasher(num_perm: int, seed: int = 1) -> MinHasher:
    return MinHasher(num_perm, seed)


def minhash(text: str, cfg: DedupConfig, han: bool, seed: int = 1) -> np.ndarray | None:
    """The signature (``num_perm`` uint32), or None when the text has no shingle."""
    (h,) = shingle_hashes([text], cfg.shingle_words, [han])
    return minhasher(cfg.num_perm, seed).signatures([h])[0] if len(h) else None


class DedupSigner(BatchStep):
    """Adds ``exact`` and ``minhash`` to each document's meta (drops nothing). Signatures are
    computed a batch of documents at a time (:class:`MinHasher`)."""

    name = "dedup_sign"

    def __init__(self, cfg: DedupConfig, ledger: Ledger):
        super().__init__(ledger)
        self.cfg = cfg

    def process(self, doc: Document) -> Document:
        return self.process_batch([doc])[0]

    def process_batch(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            doc.meta["exact"] = exact_key(doc.text)
        if not self.cfg.near:
            return docs
        hans = [languages.get(d.lang).script in UNSPACED_SCRIPTS for d in docs]
        hashes = shingle_hashes([d.text for d in docs], self.cfg.shingle_words, hans)
        signed = [i for i, h in enumerate(hashes) if len(h)]
        sigs = minhasher(self.cfg.num_perm).signatures([hashes[i] for i in signed])
        for doc in docs:
            doc.meta["minhash"] = None
        for i, sig in zip(signed, sigs):
            docs[i].meta["minhash"] = sig
        return docs


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
