"""Typed configuration of ``bloomline prepare`` (recipes live in ``configs/data/``).

Each dataclass is one component; each field has a docstring (shown by the config test and
read by users in the source). Defaults are the values a demanding user would want on a real
corpus; ``configs/data/demo.yaml`` shrinks the sizes for the bundled sample corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Optional

from bloomline import languages
from bloomline.config import check, from_dict
from bloomline.errors import ConfigError, DataError
from bloomline.host import available_cpus
from bloomline.task_spec import TaskSpec

MIN_GIB = 0.75
"""The smallest ``memory_gib`` accepted: a process's own baseline and room for one default chunk
(read.chunk_bytes 32 MiB; data_prep/passes/budget.py)."""


@dataclass
class SourceConfig:
    path: str
    """File or directory: JSONL (.jsonl, .jsonl.gz), Parquet, or a dataset saved with ``datasets``."""
    text_field: Optional[str] = None
    """Field holding the text; None: ``read.text_field``."""
    lang_field: Optional[str] = None
    """Field holding the language label; None: ``read.lang_field``."""
    lang: Optional[str] = None
    """Language of every record of this source (overrides the records' labels)."""

    def validate(self) -> None:
        check(bool(self.path), "path", "must not be empty")
        if self.lang is not None:
            check(languages.resolve(self.lang) is not None, "lang", f"'{self.lang}' is not one of BLOOM's languages")


@dataclass
class ReadConfig:
    text_field: str = "text"
    """Record field holding the document text."""
    lang_field: str = "lang"
    """Record field holding the language label (a code of bloomline.languages or an alias)."""
    id_field: str = "id"
    """Record field holding a document id (optional in the data; ``file:line`` is used when absent)."""
    chunk_bytes: int = 32 * 1024 * 1024
    """Plain JSONL files are cut into chunks of about this size (at line boundaries), the unit
    of parallel work and of resume. Compressed files and Parquet/Arrow files are one chunk each."""
    max_doc_bytes: int = 8 * 1024 * 1024
    """A record larger than this is an error ``too_long`` (it is skipped without being held in memory)."""

    def validate(self) -> None:
        check(self.chunk_bytes >= 1024, "chunk_bytes", "must be at least 1024")
        check(self.max_doc_bytes >= 16, "max_doc_bytes", "must be at least 16")


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
            check(languages.resolve(lang) is not None, f"languages.{lang}", "not one of BLOOM's languages")
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
class TokenizerConfig:
    model: Optional[str] = None
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
    the document, so the choice does not depend on corpus order)."""
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
        check(0.0 <= self.valid_fraction < 1.0, "valid_fraction", "must be in [0, 1)")
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
            check(languages.resolve(lang) is not None, f"weights.{lang}", "not one of BLOOM's languages")
            check(w >= 0, f"weights.{lang}", "must be >= 0")


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


@dataclass
class DaskConfig:
    address: Optional[str] = None
    """Address of an existing Dask scheduler (``tcp://host:8786``); None: start a LocalCluster."""
    n_workers: Optional[int] = None
    """LocalCluster worker processes; None: one per core."""
    memory_limit: str = "auto"
    """LocalCluster memory limit per worker (Dask syntax, e.g. ``4GiB``)."""

    def validate(self) -> None:
        check(self.n_workers is None or self.n_workers >= 1, "n_workers", "must be >= 1")
        check(
            self.address is None or "@" not in self.address.split("://", 1)[-1],
            "address",
            "a Dask address takes no user or password (tcp://host:port; a cluster's authentication is its "
            "TLS settings, distributed.comm.tls)",
        )

    def workers(self) -> int:
        return self.n_workers or available_cpus()


@dataclass
class PrepareConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    """Inputs; replaced by the INPUT arguments of ``bloomline prepare`` when given."""
    read: ReadConfig = field(default_factory=ReadConfig)
    """Reading and chunking."""
    langid: LangIdConfig = field(default_factory=LangIdConfig)
    """Language verification."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """Quality filters."""
    dedup: DedupConfig = field(default_factory=DedupConfig)
    """Exact and near deduplication."""
    pii: PIIConfig = field(default_factory=PIIConfig)
    """PII redaction."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer training or reuse."""
    pack: PackConfig = field(default_factory=PackConfig)
    """Validation hold-out and packing into length buckets."""
    blend: BlendConfig = field(default_factory=BlendConfig)
    """Language sampling weights written to the manifest."""
    decontaminate: DecontaminateConfig = field(default_factory=DecontaminateConfig)
    """Evaluation tasks whose items the corpus is cleaned of."""
    dask: DaskConfig = field(default_factory=DaskConfig)
    """Where the parallel work runs."""
    seed: int = 1234
    """Seed of every random choice (validation hold-out, tokenizer sample)."""
    keep_work: bool = False
    """Keep ``DIR/.work`` (intermediate files) after a successful run."""
    strict: bool = False
    """Stop at the first bad record, with its ``file:line``, instead of booking it as an error
    (``bloomline prepare --strict``). In the run's fingerprint, not in the manifest's config."""
    dropped_text_chars: int = 500
    """Characters of each dropped document's text kept in the drop log (``DIR/dropped/``); 0
    keeps none (ids, sources, reasons and scores are always kept)."""
    memory_gib: float = 2.0
    """Memory each process of the run may hold (the driver and every Dask worker), in GiB.
    Partition counts and batch sizes of the corpus-wide steps derive from it; a unit of work that
    cannot fit (one chunk of input, the tokenizer's sample, a skewed partition) stops the run with
    an error naming this setting (data_prep/passes/budget.py). The output does not depend on it."""

    def identity(self) -> dict[str, Any]:
        """What the prepared data depends on, by content; the one definition behind ``bloomline
        prepare``'s fingerprint (data_prep/pipeline.py) and the main job's prepare key
        (flows/pipeline.py). ``config``: the settings less where and how the work runs (``dask``,
        ``keep_work``, ``memory_gib``: the output does not depend on them), with a given tokenizer
        and the task items decontaminated against by their bytes, and the sources less their paths
        (a path names no content; the reading options do). ``inputs``: one digest over the bytes
        of each source's files, in the sources' order. Every input byte is read: a rerun of a
        large corpus pays one pass of reading and hashing it."""
        from bloomline.config import to_dict
        from bloomline.io import content_digest, sha256_file, sha256_tree
        from bloomline.task_spec import folder_digest
        from bloomline.tokenizer import tokenizer_files

        c = to_dict(self)
        for where in ("dask", "keep_work", "memory_gib", "strict"):  # strict: beside it, in the fingerprint
            c.pop(where, None)
        if c["tokenizer"].get("model"):
            if not Path(c["tokenizer"]["model"]).exists():
                raise DataError(f"tokenizer.model {c['tokenizer']['model']} not found")
            files = tokenizer_files(c["tokenizer"]["model"])
            digests = [sha256_file(f) for f in files]  # one file: its sha256, as before folders were read
            c["tokenizer"]["model"] = {"sha256": digests[0] if len(files) == 1 else sha256_tree(digests)}
        for t in c["decontaminate"]["tasks"]:
            if not Path(t["data"]).is_dir():
                raise ConfigError("decontaminate.tasks", f"task '{t['name']}': data folder {t['data']} does not exist")
            t["data"] = folder_digest(t["data"])
        sources = c.pop("sources")
        # each source's bytes in the sources' order, beside its options in the same order: reordered
        # sources (other chunk ids, another first of each duplicate group) or two sources' paths
        # swapped (their options now read other files) are other data
        inputs = sha256_tree([content_digest([s["path"]])[0] for s in sources])
        c["sources"] = [{k: v for k, v in s.items() if k != "path"} for s in sources]
        return {"config": c, "inputs": inputs}

    def validate(self) -> None:
        check(self.dropped_text_chars >= 0, "dropped_text_chars", "must be >= 0")
        check(
            self.memory_gib >= MIN_GIB,
            "memory_gib",
            f"must be at least {MIN_GIB} (a worker's own baseline and one chunk of input)",
        )

    def resolve_paths(self, base: Path) -> None:
        for s in self.sources:
            if not Path(s.path).is_absolute() and "://" not in s.path:
                s.path = str((base / s.path).resolve())
        for t in self.decontaminate.tasks:
            if t.data and not Path(t.data).is_absolute():
                t.data = str((base / t.data).resolve())
        if self.tokenizer.model and not Path(self.tokenizer.model).is_absolute():
            self.tokenizer.model = str((base / self.tokenizer.model).resolve())
