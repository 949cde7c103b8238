"""The quality filter's scores of a batch of documents (data_prep/steps/filters.py defines each check).

A score's definition is per document; it is computed for many documents of one language at
once (:class:`TextBatch`), because most of its cost per document is fixed: a numpy call costs a
few µs whatever its size, and a document is ~1,000 characters and ~200 words. Over a batch, the
code points of every text are taken once and shared by the character checks, the words are
split once and lower-cased once and shared by the word checks, and the per-document scans run
only where they can find something (the word repetition scan only in a document with a
repeated n-gram). The results are the per-document definitions' own, value for value
(tests/data_prep/steps/test_filters.py holds each against a plain version of its definition).
"""

from __future__ import annotations

import math
import re
from functools import cached_property, partial
from itertools import chain

import numpy as np

from data_prep.steps.text import HAN_RE, codepoints, special_chars, special_re, special_table, strip_edges


def words(text: str, han_chars: "bool | re.Pattern[str]" = False) -> list[str]:
    """The text split on whitespace, special characters stripped from both ends of each word,
    empty words dropped; with ``han_chars``, a word with a Han character counts each of its
    non-special characters as a word (ROOTS used a SentencePiece model for zh). ``han_chars`` may
    instead be the letters of a script written without spaces (``text.unspaced_letters``): a word
    with one of them is split the same way (Thai, Japanese, Khmer...)."""
    out = []
    special = special_chars()
    edge = special.__contains__
    for w in text.split():
        if w[0] in special or w[-1] in special:  # most words have clean edges: no strip call
            w = strip_edges(w, edge)
            if not w:
                continue
        out.append(w)
    if not han_chars:
        return out
    return _han_split(out, HAN_RE if han_chars is True else han_chars)


def _han_split(ws: list[str], letters: "re.Pattern[str]") -> list[str]:
    """Each word with one of ``letters`` as its non-special characters, one word each (Chinese
    writes no spaces: a "word" here is a run of a sentence, its punctuation inside)."""
    out: list[str] = []
    has_han, unspecial = letters.search, partial(special_re().sub, "")
    for w in ws:
        if has_han(w):
            out.extend(unspecial(w))
        else:
            out.append(w)
    return out


# A 64-bit polynomial hash per n-gram stands for the n-gram: counting hashes equals counting
# n-grams unless two distinct n-grams of one text collide (odds ~ L²/2⁶⁵ for L
# characters, below 1e-7 for a 1 MB text); numpy counts them at ~25 MB/s, a Counter of string
# slices at ~7.
_MULT = 0x9E3779B97F4A7C15  # odd: the golden-ratio constant of Knuth's multiplicative hashing


def ngram_hashes(values: np.ndarray, n: int) -> np.ndarray:
    """One uint64 per overlapping n-gram of ``values`` (uint64; len - n + 1 of them):
    Σ v[i+k]·M^(n-1-k) mod 2⁶⁴, composed from the hashes of power-of-two spans (log₂ n passes,
    not n)."""
    size = len(values)
    if size < n:
        return np.empty(0, dtype=np.uint64)
    spans, span = {1: values}, 1  # span -> the hash of the run of that span at every position
    with np.errstate(over="ignore"):
        while span * 2 <= n:
            h = spans[span]
            spans[span * 2] = h[:-span] * np.uint64(pow(_MULT, span, 1 << 64)) + h[span:]
            span *= 2
        out, covered = None, 0
        for s in sorted(spans, reverse=True):  # n in binary: the longest spans first
            if covered + s <= n:
                h = spans[s]
                out = (
                    h
                    if out is None
                    else out[: size - covered - s + 1] * np.uint64(pow(_MULT, s, 1 << 64)) + h[covered:]
                )
                covered += s
    return out


def _offsets(sizes: np.ndarray) -> np.ndarray:
    """[0, s0, s0+s1, ...]: where each item's run starts in the concatenation, and the end."""
    return np.concatenate(([0], np.cumsum(sizes)))


def _grams_by_item(sizes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n-grams of each item's own run within a concatenation (none across two items): their
    start positions in the concatenation, and how many each item has."""
    grams = np.maximum(sizes - n + 1, 0)
    start = _offsets(sizes)[:-1]
    first = _offsets(grams)[:-1]
    return np.arange(int(grams.sum())) + np.repeat(start - first, grams), grams


_DOC_SHIFT = np.uint64(56)
_LOW56 = np.uint64((1 << 56) - 1)


def _has_repeat(keys: np.ndarray, grams: np.ndarray) -> np.ndarray:
    """Per item (≤ 256 of them), whether a key of its run of ``keys`` may occur twice there: the
    item's index in the top 8 bits over the key's low 56, one sort. A false yes (two keys
    equal in their low 56 bits) only costs the caller an exact look."""
    if not len(keys):
        return np.zeros(len(grams), dtype=bool)
    item = np.repeat(np.arange(len(grams), dtype=np.uint64), grams)
    s = np.sort((keys & _LOW56) | (item << _DOC_SHIFT))
    same = s[1:] == s[:-1]
    out = np.zeros(len(grams), dtype=bool)
    out[(s[1:][same] >> _DOC_SHIFT).astype(np.int64)] = True
    return out


class TextBatch:
    """Documents of one language, scored together. What several checks read is computed once,
    on first use: the code points of all texts, the words of each (:func:`words`), all words
    lower-cased."""

    def __init__(self, texts: list[str], han: "bool | re.Pattern[str]" = False):
        self.texts = texts
        self.han = han
        self.words = [words(t, han) for t in texts]
        self.counts = np.fromiter(map(len, self.words), dtype=np.int64, count=len(texts))
        """Words per document."""

    def __len__(self) -> int:
        return len(self.texts)

    @cached_property
    def lengths(self) -> np.ndarray:
        """Characters (code points) per document."""
        return np.fromiter(map(len, self.texts), dtype=np.int64, count=len(self.texts))

    @cached_property
    def codepoints(self) -> np.ndarray:
        """Every text's code points, one after the other."""
        return codepoints("".join(self.texts))

    @cached_property
    def flat_words(self) -> list[str]:
        return list(chain.from_iterable(self.words))

    @cached_property
    def word_lengths(self) -> np.ndarray:
        """Characters of each word of ``flat_words``."""
        return np.fromiter(map(len, self.flat_words), dtype=np.int64, count=len(self.flat_words))

    @cached_property
    def lowered(self) -> list[str]:
        """Every document's words lower-cased, one after the other."""
        return list(map(str.lower, self.flat_words))

    @cached_property
    def lowered_lengths(self) -> np.ndarray:
        """Characters of each word of ``lowered``."""
        # lower-casing never shortens a character (it may lengthen one: "İ" -> "i̇"), so equal
        # totals mean every word kept its length
        if sum(map(len, self.lowered)) == int(self.word_lengths.sum()):
            return self.word_lengths
        return np.fromiter(map(len, self.lowered), dtype=np.int64, count=len(self.lowered))

    def word_sum(self, flags: np.ndarray) -> np.ndarray:
        """How many of each document's words ``flags`` (one bool per word of ``flat_words``) marks."""
        return _run_sums(flags, self.counts)

    def char_sum(self, flags: np.ndarray) -> np.ndarray:
        """How many of each document's characters ``flags`` (one per code point) marks."""
        return _run_sums(flags, self.lengths)


def _run_sums(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over consecutive runs of ``sizes`` items (empty runs sum to 0)."""
    c = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    ends = _offsets(sizes)
    return c[ends[1:]] - c[ends[:-1]]


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den per document, 0.0 where den is 0 (IEEE division of exact integers: the value of
    Python's ``int / int``)."""
    out = np.zeros(len(num))
    np.divide(num, den, out=out, where=den > 0)
    return out


def char_repetition_ratios(batch: TextBatch, n: int) -> np.ndarray:
    """Per document, over all overlapping character n-grams: the sum of the k largest counts over
    the number of n-grams, k = min(⌊√N⌋, n-grams seen more than once), N = distinct n-grams
    (ROOTS' formula); 0.0 for a text shorter than n."""
    pos, grams = _grams_by_item(batch.lengths, n)
    h = ngram_hashes(batch.codepoints.astype(np.uint64), n)[pos] if len(pos) else np.empty(0, np.uint64)
    out = np.zeros(len(batch))
    at = _offsets(grams).tolist()
    for i in np.flatnonzero(grams).tolist():
        s = np.sort(h[at[i] : at[i + 1]])
        last = np.flatnonzero(s[1:] != s[:-1])  # the last index of each run of equal hashes (not the final run's)
        m = len(last) + 1  # distinct n-grams
        ends = np.empty(m + 1, dtype=np.int64)  # -1, then every run's last index
        ends[0], ends[1:m], ends[m] = -1, last, len(s) - 1
        freqs = ends[1:] - ends[:-1]  # one count per distinct n-gram
        repeated = freqs[freqs > 1]  # the top k are among them: k ≤ their number
        k = min(int(math.sqrt(m)), len(repeated))
        if k:
            out[i] = int(np.sort(repeated)[-k:].sum()) / len(s)
    return out


def word_repetition_ratios(batch: TextBatch, n: int) -> np.ndarray:
    """Per document: the characters of the (lower-cased) words in n-grams that repeat an earlier
    n-gram, over all its word characters. The scan steps over a repeat whole (its words are not
    counted again by overlapping n-grams). Gopher's duplicate n-gram character fraction."""
    lowered, lens = batch.lowered, batch.lowered_lengths
    # an n-gram stands as the hash of its words' hashes (Python's str hash: equal words, equal
    # hashes within the process, all that a comparison inside one document needs)
    wh = np.fromiter(map(hash, lowered), dtype=np.int64, count=len(lowered)).view(np.uint64)
    pos, grams = _grams_by_item(batch.counts, n)
    keys = ngram_hashes(wh, n)[pos] if len(pos) else np.empty(0, np.uint64)
    out = np.zeros(len(batch))
    totals = _run_sums(lens, batch.counts)
    at, first_word = _offsets(grams).tolist(), _offsets(batch.counts).tolist()
    for i in np.flatnonzero(_has_repeat(keys, grams) & (totals > 0)).tolist():
        keys_ = keys[at[i] : at[i + 1]].tolist()
        if len(set(keys_)) == len(keys_):
            continue  # the low bits alone repeated: nothing does
        chars = np.concatenate(([0], np.cumsum(lens[first_word[i] : first_word[i + 1]])))
        gram_chars = (chars[n:] - chars[:-n]).tolist()
        seen: set[int] = set()
        repeated = j = 0
        while j < len(keys_):
            if keys_[j] in seen:
                repeated += gram_chars[j]
                j += n
            else:
                seen.add(keys_[j])
                j += 1
        out[i] = repeated / int(totals[i])
    return out


def special_ratios(batch: TextBatch) -> np.ndarray:
    """Per document, the share of its characters that are special (data_prep/steps/text.py ``is_special``)."""
    return _ratio(batch.char_sum(special_table()[batch.codepoints]), np.maximum(batch.lengths, 1))


def share_of_words(batch: TextBatch, words_set: frozenset[str], min_len: int = 0) -> np.ndarray:
    """Per document, the share of its words of at least ``min_len`` characters whose lower-cased
    form is in ``words_set`` (0.0 for a document without such words)."""
    hits = np.fromiter(map(words_set.__contains__, batch.lowered), dtype=bool, count=len(batch.lowered))
    if not min_len:
        return _ratio(batch.word_sum(hits), batch.counts)
    long_ = batch.word_lengths >= min_len
    return _ratio(batch.word_sum(hits & long_), batch.word_sum(long_))
