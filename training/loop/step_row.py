"""The numbers each rank contributes to a training step's one all-gather, by name.

Every rank sends one float64 row (training/loop/trainer.py ``_step_totals``); :class:`StepRow` is its
layout: the scalars of :data:`SCALARS`, then each language's Σ token loss, each language's
labelled tokens, then the online mixture's feedback. Packing and reading through the layout, a new
number is one more name, not a shift of every index read after it; :meth:`StepRow.totals` reads
the step's totals off the gathered rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bloomline.errors import BloomlineError
from training.planning.flops import balance_over_dp

SCALARS = ("dp_rank", "tp_rank", "pp_rank", "flops", "forward_s", "weights")
"""One number each: the rank's place in the mesh, the FLOPs it computed this step, its measured
forward seconds, and the fingerprint of the mixture weights it drew from."""


@dataclass(frozen=True)
class StepRow:
    langs: int
    """Languages of the run: the length of ``lang_loss`` and of ``lang_tokens``."""
    feedback: int = 0
    """Length of the online mixture's feedback (0 without one)."""

    @property
    def fields(self) -> dict[str, slice]:
        """Field name → its columns."""
        out = {name: slice(i, i + 1) for i, name in enumerate(SCALARS)}
        at = len(SCALARS)
        for name, n in (("lang_loss", self.langs), ("lang_tokens", self.langs), ("feedback", self.feedback)):
            out[name] = slice(at, at + n)
            at += n
        return out

    @property
    def width(self) -> int:
        return len(SCALARS) + 2 * self.langs + self.feedback

    def pack(self, **values: float | Sequence[float]) -> list[float]:
        """The row of one rank: every field by name, a vector one of the right length."""
        fields = self.fields
        if set(values) != set(fields):
            raise ValueError(f"step row: fields {sorted(set(fields) ^ set(values))} missing or unknown")
        row = [0.0] * self.width
        for name, cols in fields.items():
            v = values[name]
            v = [float(v)] if name in SCALARS else [float(x) for x in v]  # type: ignore[union-attr]
            if len(v) != cols.stop - cols.start:
                raise ValueError(f"step row: {name} has {len(v)} values, the layout {cols.stop - cols.start}")
            row[cols] = v
        return row

    def get(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Field ``name`` of gathered ``rows`` [ranks, width]: a column for a scalar, columns for a vector."""
        cols = self.fields[name]
        return rows[:, cols.start] if name in SCALARS else rows[:, cols]

    def by_rank(self, rows: np.ndarray, name: str) -> np.ndarray:
        """[ranks, 4]: (dp, tp, pp, ``name``) per rank, as training/flops.balance_over_dp takes them."""
        return np.stack([self.get(rows, f) for f in ("dp_rank", "tp_rank", "pp_rank", name)], axis=1)

    def totals(self, rows: np.ndarray, pp: int, step: int) -> dict[str, Any]:
        """Step ``step``'s totals from the gathered ``rows`` [ranks, width] of a mesh with ``pp``
        pipeline stages: the FLOPs of all replicas, the DP balance of computed FLOPs and of
        measured forward time, each language's Σ token loss and labelled tokens (from the last
        pipeline stage), and rank 0's feedback. BloomlineError if the ranks drew from different
        mixture weights."""
        tp, pp_rank = self.get(rows, "tp_rank"), self.get(rows, "pp_rank")
        first = rows[(tp == 0) & (pp_rank == 0)]  # one rank per replica: each counts its replica's whole work
        last = rows[(tp == 0) & (pp_rank == pp - 1)]  # one loss-computing rank per replica
        weights = sorted(set(self.get(rows, "weights").tolist()))
        if len(weights) > 1:  # a guard, not a sync: the weights are derived alike on every rank
            raise BloomlineError(
                f"step {step}: the ranks drew from different mixture weights (fingerprints {[int(w) for w in weights]})"
            )
        return {
            "flops": float(self.get(first, "flops").sum()),
            "dp_balance": balance_over_dp(self.by_rank(rows, "flops")),
            "dp_time_balance": balance_over_dp(self.by_rank(rows, "forward_s")),
            "lang_loss": self.get(last, "lang_loss").sum(axis=0),
            "lang_tokens": self.get(last, "lang_tokens").sum(axis=0),
            "feedback": self.get(rows, "feedback")[0],
        }  # rank 0's
