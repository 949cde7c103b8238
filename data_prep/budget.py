"""The memory budget of a ``bloomline prepare`` run: ``memory_gib``, what each process (the
driver and every Dask worker) may hold, and the work sizes derived from it.

A process first holds its own baseline (the interpreter, pyarrow, numpy, the language-ID model a
worker loads for the chunk stage: ``BASELINE_GIB``, measured); a task may hold the rest. Corpus-wide
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

BASELINE_GIB = 0.45
"""What a worker holds before a task's data: measured 0.36–0.40 GiB after the chunk stage
(CPython, pyarrow, numpy, fastText lid.176) on 2 cores; rounded up."""
MIN_GIB = 0.75
"""The smallest budget accepted: the baseline and room for one default chunk (read.chunk_bytes 32 MiB)."""


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
            raise BudgetError(f"{what} needs about {need / 2**30:.2f} GiB, more than memory_gib={self.gib:g} leaves "
                              f"a task ({self.task_bytes / 2**30:.2f} GiB after the process's own {BASELINE_GIB} GiB); "
                              f"{fix}")
