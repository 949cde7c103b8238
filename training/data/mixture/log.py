"""``RUN_DIR/mixture.jsonl``: the language weights' decisions, every rule's (training/CHECKPOINT.md,
"The online mixture's files"). Rank 0 appends each decision, fsynced, *before* the sampler applies
it: ``{"step", "weights", "cause", "inputs"}``; a decision at step s holds from step s+1. A fixed
rule records its start (and a schedule each move), an online one its start and every change."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from bloomline.io import write_bytes_atomic
from training.checkpoint.run_dir import RunDir
from training.data.mixture.controller import Change


class MixtureLog:
    """One rank's handle on the run's decisions log (only rank 0 writes)."""

    def __init__(self, run: RunDir, rank: int):
        self.run, self.rank = run, rank

    def record(self, c: Change, inputs: Optional[dict[str, Any]] = None) -> None:
        if self.rank != 0:
            return
        self.run.mixture_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.run.mixture_log, "a", encoding="utf-8") as f:  # write-ahead: on disk before it applies
            f.write(json.dumps({**c.to_json(), "inputs": inputs}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def cut(self, step: int) -> None:
        """Keep the decisions up to ``step`` (a resumed run makes the later ones again; -1: a fresh run)."""
        if self.rank == 0 and self.run.mixture_log.exists():
            kept = [json.dumps(e) + "\n" for e in read_log(self.run) if e["step"] <= step]
            write_bytes_atomic(self.run.mixture_log, "".join(kept).encode())


def read_log(run: RunDir) -> list[dict[str, Any]]:
    """The decisions in ``RUN_DIR/mixture.jsonl``, in order (a torn last line, from a kill mid-write, is dropped)."""
    if not run.mixture_log.exists():
        return []
    out = []
    for line in run.mixture_log.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out
