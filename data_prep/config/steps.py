"""The per-document steps' settings: ``langid:``, ``filters:`` (with the per-language thresholds), ``dedup:``, ``pii:``, ``decontaminate:``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from bloomline import languages
from bloomline.config import check, from_dict
from bloomline.errors import ConfigError
from bloomline.task_spec import TaskSpec


@dataclass
class LangIdConfig:
    enabled: bool = True
    """Verify natural-language documents with fastText lid.176 (see bloomline.languages)."""
    min_confidence: float = 0.65
    """A document whose top predicted language is not its label, predicted with at least this
    probability, is filtered as ``lang_mismatch``. On ../shared/corpus no real document of a
    verifiable language reaches 0.65 on a wrong label (the worst is id→ms at 0.52)."""
    min_chars: int = 40
    """Documents shorter than this are not checked (fastText is unreliable on a few words)."""

    def validate(self) -> None:
        check(0.0 < self.min_confidence <= 1.0, "min_confidence", "must be in (0, 1]")
        check(self.min_chars >= 0, "min_chars", "must be >= 0")


@dataclass
class QualityThresholds:
    """ROOTS-style quality thresholds for one natural language (Laurençon et al. 2022, App. C;
    bigscience-workshop/data-preparation ``parameters_filtering.py``). A document is dropped
    by the first check it fails, with that check's name as the reason."""

    min_words: int = 10
    """Fewer words than this: ``too_few_words``. (ROOTS default 10.)"""
    max_words: int = 100_000
    """More words than this: ``too_many_words``. (ROOTS default 100000.)"""
    char_rep_n: int = 10
    """Character n-gram length for the character repetition ratio (ROOTS: 10; 3 for zh)."""
    max_char_rep: float = 0.2
    """Maximum character repetition ratio: ``char_repetition``. (ROOTS default 0.2.)"""
    word_rep_n: int = 5
    """Word n-gram length for the word repetition ratio (ROOTS: 5; 7 for ur)."""
    max_word_rep: float = 0.3
    """Maximum word repetition ratio: ``word_repetition``. (ROOTS default 0.3.)"""
    max_special: float = 0.4
    """Maximum share of special characters (punctuation, digits, whitespace, symbols, emoji):
    ``special_characters``. (ROOTS default 0.4.)"""
    max_flagged: float = 0.1
    """Maximum share of words found in ``flagged_words``: ``flagged_words``. (ROOTS default 0.1.)"""
    flagged_words: list[str] = field(default_factory=list)
    """Lower-case flagged (porn/spam) words for this language; empty: the check is skipped."""
    max_keyboard: float = 0.3
    """Maximum share of words that are runs of adjacent keys on a keyboard row: ``keyboard_mashing``
    (not a ROOTS rule, see data_prep/steps/filters.py; clean text of ../shared/corpus reaches 0.13)."""

    def validate(self) -> None:
        check(0 <= self.min_words <= self.max_words, "min_words", "must be >= 0 and <= max_words")
        for f in fields(self):
            if f.type == "float":  # every ratio threshold (data_prep/steps/filters.py CHECKS)
                check(0.0 <= getattr(self, f.name) <= 1.0, f.name, "must be in [0, 1]")
        check(self.char_rep_n >= 1, "char_rep_n", "must be >= 1")
        check(self.word_rep_n >= 1, "word_rep_n", "must be >= 1")


@dataclass
class CodeThresholds:
    min_chars: int = 100
    """Source files shorter than this: ``too_short``."""
    max_line_chars: int = 1000
    """A line longer than this marks minified or generated code: ``long_lines``."""

    def validate(self) -> None:
        check(self.min_chars >= 0, "min_chars", "must be >= 0")
        check(self.max_line_chars >= 1, "max_line_chars", "must be >= 1")


@dataclass
class FilterConfig:
    enabled: bool = True
    """Apply the quality filters."""
    defaults: QualityThresholds = field(default_factory=QualityThresholds)
    """Thresholds for natural languages without their own entry."""
    languages: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-language overrides of ``defaults`` (only the keys given change), e.g.
    ``{en: {max_char_rep: 0.106}}``."""
    code: CodeThresholds = field(default_factory=CodeThresholds)
    """Checks for programming-language documents (natural-language checks do not apply)."""

    def validate(self) -> None:
        for lang in self.languages:
            check(languages.resolve(lang) is not None, f"languages.{lang}", f"not one of {languages.KNOWN}")
            self.for_language(lang)  # type-checks the override keys

    def for_language(self, lang: str) -> QualityThresholds:
        from bloomline.config import to_dict

        merged = to_dict(self.defaults)
        canonical = languages.resolve(lang)
        for key, over in self.languages.items():
            if languages.resolve(key) == canonical:
                merged.update(over)
                try:
                    return from_dict(QualityThresholds, merged)
                except ConfigError as e:
                    raise ConfigError(f"languages.{key}.{e.key}", e.message) from None
        return from_dict(QualityThresholds, merged)


@dataclass
class DedupConfig:
    exact: bool = True
    """Drop documents whose normalized text (lower-cased, whitespace and punctuation removed)
    hashes like an earlier document's (``duplicate:exact``)."""
    near: bool = True
    """Drop near-duplicates found by MinHash LSH (``duplicate:near``)."""
    threshold: float = 0.8
    """Jaccard similarity of shingle sets at or above which two documents are near-duplicates."""
    num_perm: int = 128
    """MinHash permutations (signature length)."""
    shingle_words: int = 5
    """Shingle = this many consecutive words (characters for scripts without spaces)."""
    window: int = 32
    """Documents that share an LSH band key are compared pairwise; in a bucket of more documents
    than this, each is compared with the ``window`` documents before it in input order, so a
    bucket of k documents costs k·window comparisons instead of k²/2 (data_prep/dedup/pairs.py)."""

    def validate(self) -> None:
        check(0.0 < self.threshold <= 1.0, "threshold", "must be in (0, 1]")
        check(self.window >= 1, "window", "must be >= 1")
        check(16 <= self.num_perm <= 1024, "num_perm", "must be in [16, 1024]")
        check(self.shingle_words >= 1, "shingle_words", "must be >= 1")


@dataclass
class PIIConfig:
    enabled: bool = True
    """Redact personal information before tokenization."""
    kinds: list[str] = field(default_factory=lambda: ["email", "ip_address", "phone"])
    """Which kinds to redact: email, ip_address, phone."""

    def validate(self) -> None:
        for i, k in enumerate(self.kinds):
            check(
                k in ("email", "ip_address", "phone"), f"kinds[{i}]", f"unknown kind '{k}' (email, ip_address, phone)"
            )


@dataclass
class DecontaminateConfig:
    """Drop corpus documents that share an n-gram with an evaluation task's item (data_prep/steps/decontaminate.py)."""

    tasks: list[TaskSpec] = field(default_factory=list)
    """The tasks, as the evaluation's ``tasks`` lists them (``name``, ``data``: ``DATA/<lang>.jsonl``,
    ``langs``, ``limit``); empty: no decontamination."""
    ngram: int = 13
    """Words per n-gram in languages written with spaces (GPT-3's and lm-eval's 13)."""
    char_ngram: int = 20
    """Characters per n-gram in languages written without spaces (Chinese: about 13 words)."""

    def validate(self) -> None:
        check(self.ngram >= 1, "ngram", "must be >= 1")
        check(self.char_ngram >= 1, "char_ngram", "must be >= 1")
        for i, t in enumerate(self.tasks):
            check(bool(t.data), f"tasks[{i}].data", f"task '{t.name}' needs its data folder to decontaminate against")
