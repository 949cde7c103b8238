"""Quality filter step, modelled on BigScience's ROOTS filters.

Definitions follow ``bigscience-workshop/data-preparation``
(``preprocessing/training/01b_oscar_cleaning_and_filtering/filtering.py``) and Laurençon et al.
2022 ("The BigScience ROOTS Corpus", App. C). Checks run in ROOTS' order and a document is
dropped by the first it fails, with the check's name as reason:

1. ``too_few_words`` / ``too_many_words`` — words: the text split on whitespace, special
   characters stripped from both ends of each word, empty words dropped. Scripts written without
   spaces (Han) count each character as a word (ROOTS used a SentencePiece model for zh).
2. ``char_repetition`` — over all overlapping character n-grams (n = ``char_rep_n``), the
   sum of the k largest counts over the sum of all counts, k = min(⌊√N⌋, number of n-grams seen
   more than once), N = number of distinct n-grams (the formula of ROOTS' code).
3. ``word_repetition`` — the share of the text's word characters that repeat a word n-gram
   (n = ``word_rep_n``, lower-cased) already seen earlier in the document: Gopher's duplicate
   n-gram character fraction (Rae et al. 2021, App. A; datatrove's ``find_all_duplicate``), not
   ROOTS' share of n-gram occurrences that occur twice. Two reasons, both measured on text ROOTS'
   ratio drops (Fon legal news, whose grammar repeats short function words and a long court
   name): only the copies count, not the phrase's first use (a phrase said twice is half
   repetition, not all of it); and words weigh by their length, so the short function words of
   a language's grammar weigh less than the long words that repeated boilerplate is made of.
   Junk repeated as whole lines still scores ~0.85-0.97 in every language.
4. ``special_characters`` — share of characters that are punctuation, digits, whitespace or
   symbols (Unicode categories P*, S* and Z*, which include emoji — ROOTS used the ``emoji``
   package's list; the categories cover it without another dependency).
5. ``flagged_words`` — share of lower-cased words in the language's flagged-word list.
6. ``keyboard_mashing`` — share of words (3+ letters) that are a run of adjacent keys on one
   row of a QWERTY, QWERTZ or AZERTY keyboard ("asdfg", "yuio", "vbnm"), forwards or backwards.
   Not a ROOTS rule: ROOTS caught such text with its KenLM perplexity filter, which bloomline
   does not ship; keyboard runs are the one kind of gibberish that is both common in scraped
   text and rare in any language's real words (measured on ../shared/corpus: the highest share
   in clean text is 0.13, Lingala, whose common word "eza" is an AZERTY run; mashing has ~0.9).

Programming-language documents get only the code checks: ``too_short`` and ``long_lines``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from bloomline import languages
from data_prep.config import FilterConfig, QualityThresholds
from data_prep.document import Document, Ledger
from data_prep.step import PipelineStep
from data_prep.text import codepoints, count_special, is_han, special_chars, strip_edges


def words(text: str, han_chars: bool = False) -> list[str]:
    out = []
    special = special_chars()
    edge = special.__contains__
    for w in text.split():
        if w[0] in special or w[-1] in special:  # most words have clean edges: no strip call
            w = strip_edges(w, edge)
            if not w:
                continue
        if han_chars and any(is_han(c) for c in w):
            out.extend(c for c in w if c not in special)
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


def char_repetition_ratio(text: str, n: int) -> float:
    h = np.sort(ngram_hashes(codepoints(text).astype(np.uint64), n))
    if not len(h):
        return 0.0
    starts = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1])))
    freqs = -np.sort(-np.diff(np.append(starts, len(h))))  # count per distinct n-gram, largest first
    repeated = int(np.count_nonzero(freqs > 1))
    k = min(int(math.sqrt(len(freqs))), repeated)
    return int(freqs[:k].sum()) / len(h)


def word_repetition_ratio(ws: list[str], n: int) -> float:
    """Characters of the words in n-grams that repeat an earlier n-gram, over all word characters.
    The scan steps over a repeat whole (its words are not counted again by overlapping n-grams)."""
    lowered = list(map(str.lower, ws))
    lens = np.fromiter(map(len, lowered), dtype=np.int64, count=len(lowered))
    total = int(lens.sum())
    # an n-gram stands as the hash of its words' hashes (Python's str hash: equal words, equal
    # hashes within the process, all that a comparison inside one document needs)
    keys = ngram_hashes(np.fromiter(map(hash, lowered), dtype=np.int64, count=len(lowered)).view(np.uint64), n)
    if not total or len(np.unique(keys)) == len(keys):
        return 0.0  # no n-gram occurs twice: nothing repeats (most clean documents)
    chars = np.concatenate(([0], np.cumsum(lens)))
    gram_chars = (chars[n:] - chars[:-n]).tolist()
    keys_ = keys.tolist()
    seen: set[int] = set()
    repeated = i = 0
    while i < len(keys_):
        if keys_[i] in seen:
            repeated += gram_chars[i]
            i += n
        else:
            seen.add(keys_[i])
            i += 1
    return repeated / total


def special_ratio(text: str) -> float:
    return count_special(text) / max(1, len(text))


def flagged_ratio(ws: list[str], flagged: set[str]) -> float:
    if not ws or not flagged:
        return 0.0
    return min(1.0, sum(map(flagged.__contains__, map(str.lower, ws))) / len(ws))


@dataclass(frozen=True)
class Check:
    """One quality check, named once: the rest (the scores recorded, the filter's order, the
    threshold derivation, the what-if report, the recipe's validation) reads this table."""

    reason: str
    """The drop reason of a document that fails it."""
    score: str
    """The score it compares (a column of ``DIR/scores/``; two checks may share one)."""
    limit: str
    """The threshold's field on QualityThresholds (natural languages) or CodeThresholds (code),
    which holds its default and documents it."""
    measure: Callable[[str, list[str], Any], float | None]
    """``(text, words, thresholds) -> score`` (None: the check does not apply)."""
    below: bool = False
    """Fails when the score is *below* the threshold (otherwise above it)."""
    derived: bool = False
    """data_prep/thresholds.py derives the threshold per language from clean text and junk
    (otherwise the recipe's value stands)."""

    def default(self, thresholds: type) -> Any:
        """The threshold's default: the field's default on ``thresholds``' class."""
        return next(f.default for f in fields(thresholds) if f.name == self.limit)


def _flagged(text: str, ws: list[str], t: QualityThresholds) -> float | None:
    return flagged_ratio(ws, set(t.flagged_words)) if t.flagged_words else None


CHECKS = (  # in ROOTS' order; a document is dropped by the first check it fails
    Check("too_few_words", "words", "min_words", lambda text, ws, t: float(len(ws)), below=True),
    Check("too_many_words", "words", "max_words", lambda text, ws, t: float(len(ws))),
    Check(
        "char_repetition",
        "char_rep",
        "max_char_rep",
        lambda text, ws, t: char_repetition_ratio(text, t.char_rep_n),
        derived=True,
    ),
    Check(
        "word_repetition",
        "word_rep",
        "max_word_rep",
        lambda text, ws, t: word_repetition_ratio(ws, t.word_rep_n),
        derived=True,
    ),
    Check("special_characters", "special", "max_special", lambda text, ws, t: special_ratio(text), derived=True),
    Check("flagged_words", "flagged", "max_flagged", _flagged),
    Check("keyboard_mashing", "keyboard", "max_keyboard", lambda text, ws, t: keyboard_ratio(ws), derived=True),
)
"""The natural-language checks."""
CODE_CHECKS = (
    Check("too_short", "chars", "min_chars", lambda text, ws, t: float(len(text)), below=True),
    Check("long_lines", "max_line", "max_line_chars", lambda text, ws, t: float(max(map(len, text.split("\n"))))),
)
"""The checks of programming-language documents."""
SCORES = tuple(dict.fromkeys(c.score for c in CHECKS + CODE_CHECKS))
"""Every score a document can have (the columns of ``DIR/scores/``)."""


def quality_scores(text: str, t: QualityThresholds, han_chars: bool = False) -> dict[str, float | None]:
    """Every natural-language check's score of ``text`` (``flagged`` None when the language has no
    list). All are computed, not only up to the first failure, so a report can say what another
    threshold would do without running the filter again."""
    ws = words(text, han_chars)
    return {c.score: c.measure(text, ws, t) for c in CHECKS}


def code_scores(text: str) -> dict[str, float | None]:
    return {c.score: c.measure(text, [], None) for c in CODE_CHECKS}


def first_failure(
    scores: dict[str, float | None], thresholds: Any, checks: tuple[Check, ...] = CHECKS
) -> tuple[str, float, float] | None:
    """``(reason, score, threshold)`` of the first check the scores fail, or None (kept)."""
    for c in checks:
        v, limit = scores.get(c.score), getattr(thresholds, c.limit)
        if v is not None and (v < limit if c.below else v > limit):
            return c.reason, v, float(limit)
    return None


# Key rows of the common Latin layouts: runs along them are what a hand mashing a keyboard types.
KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm", "qwertzuiop", "yxcvbnm", "azertyuiop", "qsdfghjklm", "wxcvbn")
_RUNS = frozenset(
    r[i:j] for row in KEY_ROWS for r in (row, row[::-1]) for i in range(len(r)) for j in range(i + 3, len(r) + 1)
)


def keyboard_ratio(ws: list[str]) -> float:
    """Share of words of 3+ letters that are a run of adjacent keys on one keyboard row."""
    long_ = [w for w in ws if len(w) >= 3]
    return sum(map(_RUNS.__contains__, map(str.lower, long_))) / len(long_) if long_ else 0.0


class QualityFilter(PipelineStep):
    name = "quality"

    def __init__(self, cfg: FilterConfig, ledger: Ledger, strict: bool = False):
        super().__init__(ledger, strict)
        self.cfg = cfg
        self._thresholds: dict[str, QualityThresholds] = {}
        self.scores: list[dict[str, Any]] = []  # one row per document checked, in input order

    def thresholds(self, lang: str) -> QualityThresholds:
        t = self._thresholds.get(lang)
        if t is None:
            t = self._thresholds[lang] = self.cfg.for_language(lang)
        return t

    def score_rows(self) -> list[dict[str, Any]]:
        return self.scores

    def process(self, doc: Document) -> Document | None:
        lang = languages.BY_CODE[doc.lang]
        if lang.kind == "code":
            scores = code_scores(doc.text)
            failed = first_failure(scores, self.cfg.code, CODE_CHECKS)
        else:
            t = self.thresholds(doc.lang)
            scores = quality_scores(doc.text, t, han_chars=lang.script in ("Hans", "Hant"))
            failed = first_failure(scores, t)
        self.scores.append(
            {"lang": doc.lang, "reason": failed[0] if failed else None, **{k: scores.get(k) for k in SCORES}}
        )
        if failed:
            self.drop(doc, "filtered", failed[0], score=failed[1], threshold=failed[2])
            return None
        return doc
