"""The memory budget of a ``bloomline prepare`` run: ``memory_gib``, what each process (the
driver and every Dask worker) may hold, and the work sizes derived from it.

A process first holds its own baseline (the interpreter, pyarrow, numpy, the language-ID model a
worker loads for the chunks pass: ``BASELINE_GIB``, measured); a task may hold the rest. Corpus-wide
steps are cut into tasks whose data fits that rest, with a cap that keeps tasks small enough to
spread over the workers and to keep each process's peak the same whatever the corpus size.
Units that cannot be cut (one chunk of input, the tokenizer's sample) are checked before any work
starts, and a task whose input turns out larger than its share (a skewed partition) checks before
it loads: either way the run stops with a :class:`BudgetError` naming the setting, never with the
kernel's OOM killer.
"""

from __future__ import annotations

from dataclasses import dataclass

from bloomline.errors import DataError
from data_prep.config import PrepareConfig

BASELINE_GIB = 0.3
"""What a process holds before any task's data: a Dask worker with CPython, pyarrow, numpy and
fastText lid.176 loaded, 0.21 GiB; the driver with Prefect and the Dask client, 0.27 GiB
(measured on 2 cores); rounded up."""
CHUNK_BYTES_PER_BYTE = 8
"""The chunks pass holds a chunk's documents several times over (the parsed records, their
signatures, the sorted Arrow table): peak RSS grew 7.3 bytes per byte of JSONL from an 8 MiB to a
32 MiB chunk (measured)."""
SPM_BYTES_PER_SAMPLE_BYTE = 3.5
"""SentencePiece's BPE trainer holds the sample and its pair statistics: peak RSS grew 3.0 bytes
per byte of sample from 25 MB to 100 MB at vocab_size 32000 (measured; data_prep/passes/tokenizer.py)."""
SPM_FIXED_BYTES = 192 * 2**20
"""And about this much whatever the sample (its tables at vocab_size 32000)."""
BPE_BYTES_PER_SAMPLE_BYTE = 30
"""The ``tokenizers`` BPE trainer (``tokenizer.kind: byte_bpe``, ``tokenizer.extend_with``) holds a
word table with every pair's positions: peak RSS grew 30 bytes per byte of sample from 5 MB to 10 MB
of real text in 46 languages at vocab_size 32000 (42 from 2 MB to 5 MB; measured on
../shared/corpus, whose words were still new), ten times SentencePiece's."""
BPE_FIXED_BYTES = 100 * 2**20
"""And about this much whatever the sample."""


class BudgetError(DataError):
    """A unit of work needs more memory than ``memory_gib`` leaves a task."""


@dataclass(frozen=True)
class Budget:
    gib: float
    """``memory_gib``: GiB each process of the run may hold."""

    @property
    def task_bytes(self) -> int:
        """Bytes a task's data may take: the budget less the process's baseline."""
        return int((self.gib - BASELINE_GIB) * 2**30)

    def rows(self, bytes_per_row: int, cap: int) -> int:
        """Rows of ``bytes_per_row`` (the task's own temporaries included) one task may hold, at most ``cap``."""
        return max(1, min(cap, self.task_bytes // bytes_per_row))

    def check(self, what: str, need: int, fix: str) -> None:
        """Raise :class:`BudgetError` when ``need`` bytes exceed a task's share."""
        if need > self.task_bytes:
            raise BudgetError(
                f"{what} needs about {need / 2**30:.2f} GiB, more than memory_gib={self.gib:g} leaves "
                f"a task ({self.task_bytes / 2**30:.2f} GiB after the process's own {BASELINE_GIB} GiB); "
                f"{fix}"
            )


def check_inputs(cfg: PrepareConfig) -> None:
    """Before any work: every chunk of input and the tokenizer's sample fit a task of
    ``memory_gib`` (from file sizes and metadata; nothing is parsed)."""
    from data_prep.inputs.chunk_plan import chunk_bytes, discover

    budget = Budget(cfg.memory_gib)
    corpus = 0  # bytes of records, at most: the tokenizer's sample is no larger
    for source in cfg.sources:
        for path, fmt in discover(source):
            size, how = chunk_bytes(path, fmt, cfg.read)
            corpus += path.stat().st_size if fmt == "jsonl" else size  # a JSONL file: many chunks
            if fmt == "jsonl":
                what, fix = f"a chunk of {path} ({size / 2**20:,.0f} MiB)", "lower read.chunk_bytes or raise memory_gib"
            else:
                what = f"input {path}, read as one chunk of about {size / 2**20:,.0f} MiB of records ({how}),"
                fix = "compressed and Parquet files are not cut into chunks: split the file, or raise memory_gib"
            budget.check(what, size * CHUNK_BYTES_PER_BYTE, fix)
    t = cfg.tokenizer
    if not t.model or t.extend_with:  # a tokenizer is trained on the sample
        bpe = t.kind == "byte_bpe" or t.extend_with > 0
        per, fixed = (
            (BPE_BYTES_PER_SAMPLE_BYTE, BPE_FIXED_BYTES) if bpe else (SPM_BYTES_PER_SAMPLE_BYTE, SPM_FIXED_BYTES)
        )
        sample = min(t.sample_bytes, corpus)
        budget.check(
            f"training the tokenizer on a sample of {sample:,} bytes (tokenizer.sample_bytes, or the corpus when smaller)",
            int(sample * per) + fixed,
            "lower tokenizer.sample_bytes or raise memory_gib",
        )


def bundle_bytes(cfg: PrepareConfig) -> int:
    """How many bytes of records a bundle of small input files may hold (data_prep/inputs/chunk_plan.py
    plan_chunks): ``read.chunk_bytes``, or less when that would not fit a task of ``memory_gib``."""
    return max(1, min(cfg.read.chunk_bytes, Budget(cfg.memory_gib).task_bytes // CHUNK_BYTES_PER_BYTE))
