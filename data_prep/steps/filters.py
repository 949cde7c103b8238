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

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from bloomline import languages
from data_prep.config import FilterConfig, QualityThresholds
from data_prep.steps.document import Document, Ledger
from data_prep.steps.scores import (
    TextBatch,
    char_repetition_ratios,
    share_of_words,
    special_ratios,
    word_repetition_ratios,
)
from data_prep.steps.step import BatchStep
from data_prep.steps.text import unspaced_letters


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
    measure: Callable[[TextBatch, Any], np.ndarray | None]
    """``(documents of one language, their thresholds) -> one score per document`` (None: the
    check does not apply to that language); data_prep/steps/scores.py."""
    below: bool = False
    """Fails when the score is *below* the threshold (otherwise above it)."""
    derived: bool = False
    """data_prep/calibration/thresholds.py derives the threshold per language from clean text and junk
    (otherwise the recipe's value stands)."""

    def default(self, thresholds: type) -> Any:
        """The threshold's default: the field's default on ``thresholds``' class."""
        return next(f.default for f in fields(thresholds) if f.name == self.limit)


def _flagged(batch: TextBatch, t: QualityThresholds) -> np.ndarray | None:
    return share_of_words(batch, _word_set(tuple(t.flagged_words))) if t.flagged_words else None


@lru_cache(maxsize=64)
def _word_set(ws: tuple[str, ...]) -> frozenset[str]:
    return frozenset(ws)


def _max_line(batch: TextBatch, t: Any) -> np.ndarray:
    return np.array([max(map(len, text.split("\n"))) for text in batch.texts], dtype=np.float64)


# Key rows of the common Latin layouts: runs along them are what a hand mashing a keyboard types.
KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm", "qwertzuiop", "yxcvbnm", "azertyuiop", "qsdfghjklm", "wxcvbn")
KEY_RUNS = frozenset(
    r[i:j] for row in KEY_ROWS for r in (row, row[::-1]) for i in range(len(r)) for j in range(i + 3, len(r) + 1)
)
"""Every run of 3+ adjacent keys on one of those rows, forwards or backwards."""


CHECKS = (  # in ROOTS' order; a document is dropped by the first check it fails
    Check("too_few_words", "words", "min_words", lambda b, t: b.counts.astype(np.float64), below=True),
    Check("too_many_words", "words", "max_words", lambda b, t: b.counts.astype(np.float64)),
    Check(
        "char_repetition",
        "char_rep",
        "max_char_rep",
        lambda b, t: char_repetition_ratios(b, t.char_rep_n),
        derived=True,
    ),
    Check(
        "word_repetition",
        "word_rep",
        "max_word_rep",
        lambda b, t: word_repetition_ratios(b, t.word_rep_n),
        derived=True,
    ),
    Check("special_characters", "special", "max_special", lambda b, t: special_ratios(b), derived=True),
    Check("flagged_words", "flagged", "max_flagged", _flagged),
    Check(
        "keyboard_mashing",
        "keyboard",
        "max_keyboard",
        lambda b, t: share_of_words(b, KEY_RUNS, min_len=3),  # words of 3+ letters
        derived=True,
    ),
)
"""The natural-language checks."""
CODE_CHECKS = (
    Check("too_short", "chars", "min_chars", lambda b, t: b.lengths.astype(np.float64), below=True),
    Check("long_lines", "max_line", "max_line_chars", _max_line),
)
"""The checks of programming-language documents."""
SCORES = tuple(dict.fromkeys(c.score for c in CHECKS + CODE_CHECKS))
"""Every score a document can have (the columns of ``DIR/scores/``)."""


def batch_scores(batch: TextBatch, t: Any, checks: tuple[Check, ...] = CHECKS) -> list[dict[str, float | None]]:
    """Every check's score of each document of ``batch`` (one language, thresholds ``t``).
    All are computed, not only up to the first failure, so a report can say what another
    threshold would do without running the filter again."""
    columns = {}
    for c in checks:
        if c.score not in columns:
            v = c.measure(batch, t)
            columns[c.score] = [None] * len(batch) if v is None else v.tolist()
    names = list(columns)
    return [dict(zip(names, row)) for row in zip(*columns.values())]


def quality_scores(text: str, t: QualityThresholds, han_chars: bool = False) -> dict[str, float | None]:
    """Every natural-language check's score of one text (``flagged`` None when the language has
    no list)."""
    return batch_scores(TextBatch([text], han_chars), t)[0]


def code_scores(text: str) -> dict[str, float | None]:
    return batch_scores(TextBatch([text]), None, CODE_CHECKS)[0]


def first_failure(
    scores: dict[str, float | None], thresholds: Any, checks: tuple[Check, ...] = CHECKS
) -> tuple[str, float, float] | None:
    """``(reason, score, threshold)`` of the first check the scores fail, or None (kept)."""
    for c in checks:
        v, limit = scores.get(c.score), getattr(thresholds, c.limit)
        if v is not None and (v < limit if c.below else v > limit):
            return c.reason, v, float(limit)
    return None


class QualityFilter(BatchStep):
    """The checks over each batch of documents, a language at a time (data_prep/steps/scores.py);
    drops and score rows in input order."""

    name = "quality"

    def __init__(self, cfg: FilterConfig, ledger: Ledger):
        super().__init__(ledger)
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
        return self.process_batch([doc])[0]

    def process_batch(self, docs: list[Document]) -> list[Document | None]:
        by_lang: dict[str, list[int]] = {}
        for i, d in enumerate(docs):
            by_lang.setdefault(d.lang, []).append(i)
        scored: list[Any] = [None] * len(docs)
        for code, idx in by_lang.items():
            lang = languages.get(code)
            if lang.kind == "code":
                t, checks, han = self.cfg.code, CODE_CHECKS, False
            else:
                t, checks, han = self.thresholds(code), CHECKS, unspaced_letters(lang.script) or False
            rows = batch_scores(TextBatch([docs[i].text for i in idx], han), t, checks)
            for i, row in zip(idx, rows):
                scored[i] = (row, first_failure(row, t, checks))
        out: list[Document | None] = []
        for doc, (row, failed) in zip(docs, scored):
            self.scores.append(
                {"lang": doc.lang, "reason": failed[0] if failed else None, **{k: row.get(k) for k in SCORES}}
            )
            if failed:
                self.drop(doc, "filtered", failed[0], score=failed[1], threshold=failed[2])
                out.append(None)
            else:
                out.append(doc)
        return out
