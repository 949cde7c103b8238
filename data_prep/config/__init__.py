"""Typed configuration of ``bloomline prepare`` (recipes live in ``configs/data/``).

Each dataclass is one component; each field has a docstring (shown by the config test and
read by users in the source). Defaults are the values a demanding user would want on a real
corpus; ``configs/data/demo.yaml`` shrinks the sizes for the bundled sample corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bloomline.config import check
from bloomline.errors import ConfigError, DataError
from data_prep.config.inputs import MIN_GIB, DaskConfig, ReadConfig, SourceConfig
from data_prep.config.passes import BlendConfig, PackConfig, TokenizerConfig
from data_prep.config.steps import (
    CodeThresholds,
    DecontaminateConfig,
    DedupConfig,
    FilterConfig,
    LangIdConfig,
    PIIConfig,
    QualityThresholds,
)

__all__ = [
    "MIN_GIB",
    "BlendConfig",
    "CodeThresholds",
    "DaskConfig",
    "DecontaminateConfig",
    "DedupConfig",
    "FilterConfig",
    "LangIdConfig",
    "PIIConfig",
    "PackConfig",
    "PrepareConfig",
    "QualityThresholds",
    "ReadConfig",
    "SourceConfig",
    "TokenizerConfig",
]


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
    recipe: Optional[str] = None
    """The recipe file these settings were read from, as the command was given it (set by
    ``bloomline prepare`` and the main job): recorded in the manifest beside :meth:`summary`, not
    part of what the data depends on (its settings are)."""
    memory_gib: float = 2.0
    """Memory each process of the run may hold (the driver and every Dask worker), in GiB.
    Partition counts and batch sizes of the corpus-wide steps derive from it; a unit of work that
    cannot fit (one chunk of input, the tokenizer's sample, a skewed partition) stops the run with
    an error naming this setting (data_prep/passes/budget.py). The output does not depend on it."""

    def identity(self) -> dict[str, Any]:
        """What the prepared data depends on, by content; the one definition behind ``bloomline
        prepare``'s fingerprint (data_prep/pipeline.py) and the main job's prepare key
        (flows/stages/pipeline.py). ``config``: the settings less where and how the work runs (``dask``,
        ``keep_work``, ``memory_gib``: the output does not depend on them), with a given tokenizer
        and the task items decontaminated against by their bytes, and the sources less their paths
        (a path names no content; the reading options do). ``inputs``: one digest over the bytes
        of each source's files, in the sources' order. Every input byte is read: a rerun of a
        large corpus pays one pass of reading and hashing it."""
        from bloomline.config import to_dict
        from bloomline.io import sha256_file, sha256_tree
        from bloomline.storage import content_digest
        from bloomline.task_spec import folder_digest
        from bloomline.tokenizer import tokenizer_files

        c = to_dict(self)
        for where in ("dask", "keep_work", "memory_gib", "strict", "recipe"):  # strict: beside it, in the fingerprint
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

    def summary(self) -> str:
        """The recipe in force, in one line: its file, the tokenizer, the buckets and where the
        quality thresholds come from (printed when ``prepare`` starts, kept in the manifest)."""
        t = self.tokenizer
        if t.model:
            tok = f"tokenizer {t.model}" + (f" grown by {t.extend_with:,}" if t.extend_with else "")
        else:
            tok = f"a {t.kind} tokenizer of {t.vocab_size:,} trained"
        if not self.filters.enabled:
            thresholds = "quality filters off"
        else:
            fitted = len(self.filters.languages)
            thresholds = (
                f"thresholds fitted for {fitted} language(s), ROOTS' defaults for the rest"
                if fitted
                else ("ROOTS' default thresholds for every language")
            )
        held = f"{self.pack.valid_fraction:.0%} held out" if self.pack.valid_fraction < 1 else "every document held out"
        return f"{self.recipe or 'settings'}: {tok}; buckets {self.pack.buckets}; {thresholds}; {held}"

    def validate(self) -> None:
        check(self.dropped_text_chars >= 0, "dropped_text_chars", "must be >= 0")
        check(
            self.memory_gib >= MIN_GIB,
            "memory_gib",
            f"must be at least {MIN_GIB} (a worker's own baseline and one chunk of input)",
        )
