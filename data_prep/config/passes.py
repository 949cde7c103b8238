"""The settings of the passes that make the output: ``tokenizer:``, ``pack:``, ``blend:``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from bloomline import languages
from bloomline.config import Location, check


@dataclass
class TokenizerConfig:
    model: Optional[Location] = None
    """An existing tokenizer to reuse: a SentencePiece ``.model``, a Hugging Face ``tokenizer.json``
    (byte-level BPE, as BLOOM's), or a model folder holding one; its ids are the shards' ids.
    None: train one of ``kind`` on the corpus."""
    kind: Literal["sentencepiece", "byte_bpe"] = "sentencepiece"
    """What to train when no ``model`` is given: SentencePiece BPE with byte fallback (the default),
    or ``byte_bpe``, BLOOM's own byte-level BPE made with the ``tokenizers`` library
    (data_prep/passes/byte_bpe.py)."""
    extend_with: int = 0
    """Grow ``model`` (a byte-level ``tokenizer.json``) by this many tokens learned on this corpus's
    sample; existing ids stay (data_prep/passes/byte_bpe.py). 0: use ``model`` as it is."""
    vocab_size: int = 32_000
    """Vocabulary size of the trained tokenizer (BLOOM: 250680 before padding)."""
    alpha: float = 0.3
    """Language sampling exponent for the training sample: p(lang) ∝ bytes(lang)^alpha
    (XLM-R/BLOOM-style smoothing that raises low-resource languages; 1 = proportional)."""
    sample_bytes: int = 200 * 1024 * 1024
    """Size of the training sample drawn with the smoothed weights."""
    character_coverage: float = 0.9995
    """Share of characters the vocabulary must cover; the rest fall back to bytes."""
    num_threads: Optional[int] = None
    """Threads for SentencePiece training; None: all cores."""

    def validate(self) -> None:
        check(self.vocab_size >= 64, "vocab_size", "must be at least 64")
        check(0.0 < self.alpha <= 1.0, "alpha", "must be in (0, 1]")
        check(self.sample_bytes >= 1024, "sample_bytes", "must be at least 1024")
        check(0.9 <= self.character_coverage <= 1.0, "character_coverage", "must be in [0.9, 1]")
        check(self.extend_with >= 0, "extend_with", "must be >= 0")
        check(
            not self.extend_with or (self.model is not None and not self.model.endswith(".model")),
            "extend_with",
            "grows a Hugging Face tokenizer.json (byte-level BPE): set tokenizer.model to one, or a folder holding one",
        )


@dataclass
class PackConfig:
    buckets: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    """Sample lengths in tokens, ascending; the largest is the sequence length."""
    valid_fraction: float = 0.01
    """Share of each language's documents held out for validation (chosen by a seeded hash of
    the document, so the choice does not depend on corpus order). 1: every document, for text
    that is only evaluated on (``bloomline evaluate --model … --text``); training refuses such data."""
    valid_min_docs: int = 1
    """Hold out at least this many documents per language (when the language has more)."""
    max_open_samples: int = 256
    """Best-fit packing keeps this many partly filled samples open per language and split."""
    part_bytes: int = 64 * 1024 * 1024
    """Text of one language is tokenized and packed in parts of about this size (the unit of
    parallel work and of resume)."""
    tokenize_batch: int = 512
    """Documents per SentencePiece batch call."""

    def validate(self) -> None:
        b = self.buckets
        check(len(b) >= 1, "buckets", "needs at least one length")
        check(all(x >= 8 for x in b), "buckets", "lengths must be at least 8 tokens")
        check(b == sorted(set(b)), "buckets", f"must be strictly ascending, got {b}")
        check(0.0 <= self.valid_fraction <= 1.0, "valid_fraction", "must be in [0, 1]")
        check(self.valid_min_docs >= 0, "valid_min_docs", "must be >= 0")
        check(self.max_open_samples >= 1, "max_open_samples", "must be >= 1")
        check(self.part_bytes >= 1024, "part_bytes", "must be at least 1024")
        check(self.tokenize_batch >= 1, "tokenize_batch", "must be >= 1")

    @property
    def seq_len(self) -> int:
        return self.buckets[-1]


@dataclass
class BlendConfig:
    weights: dict[str, float] = field(default_factory=dict)
    """Explicit sampling ratios per language (normalized over the languages present);
    empty: alpha-smoothed from token counts."""
    alpha: float = 0.3
    """p(lang) ∝ tokens(lang)^alpha when ``weights`` is empty."""

    def validate(self) -> None:
        check(0.0 < self.alpha <= 1.0, "alpha", "must be in (0, 1]")
        for lang, w in self.weights.items():
            check(languages.resolve(lang) is not None, f"weights.{lang}", f"not one of {languages.KNOWN}")
            check(w >= 0, f"weights.{lang}", "must be >= 0")
