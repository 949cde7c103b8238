"""The validation split (data_prep/FORMAT.md, "Validation split"): which kept documents of each
language are held out, decided from the documents' seeded draws after deduplication.

Each kept document has a uniform draw ``u(seed, id, text)`` (data_prep/steps/document.py
``uniform_draw``, computed once in the chunks pass). What the rule needs of a language is small
and mergeable — how many documents, how many draws fall under the fraction, the ``valid_min_docs``
smallest draws and the largest — so each unit of work summarises its own documents and the
driver merges summaries: state per language, never per document.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class SplitDraws:
    """What the validation rule of one language needs of its kept documents' draws."""

    docs: int = 0
    under: int = 0
    """Documents whose draw is below the validation fraction."""
    smallest: list[float] = field(default_factory=list)
    """The ``valid_min_docs`` smallest draws, ascending."""
    largest: float = 0.0

    @classmethod
    def of(cls, draws: np.ndarray, fraction: float, keep: int) -> "SplitDraws":
        return cls(
            int(len(draws)),
            int((draws < fraction).sum()),
            np.sort(draws)[:keep].tolist(),
            float(draws.max()) if len(draws) else 0.0,
        )

    def merge(self, other: "SplitDraws", keep: int) -> None:
        self.docs += other.docs
        self.under += other.under
        self.smallest = sorted(self.smallest + other.smallest)[:keep]
        self.largest = max(self.largest, other.largest)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validation_rules(draws: dict[str, SplitDraws], fraction: float, min_docs: int) -> dict[str, list]:
    """Per language ``[op, threshold]``: a kept document is held out when ``draw op threshold``.

    The held-out documents are the k with the smallest draws, where k is the count under the
    fraction, raised to ``min_docs`` and capped so that training keeps at least one document; a
    fraction of 1 holds out every document (text to evaluate on only: ``bloomline evaluate --text``)."""
    rules: dict[str, list] = {}
    for lang, d in draws.items():
        if fraction >= 1.0:
            rules[lang] = ["le", 1.0]  # every draw is in [0, 1)
            continue
        lo, hi = min(min_docs, d.docs - 1), d.docs - 1
        if d.under < lo:
            rules[lang] = ["le", d.smallest[lo - 1]]
        elif d.under > hi:
            rules[lang] = ["lt", d.largest]
        else:
            rules[lang] = ["lt", fraction]
    return rules


def held_out(draw: float, rule: list) -> bool:
    """Whether a document with ``draw`` goes to validation under its language's ``rule``."""
    op, threshold = rule
    return draw < threshold if op == "lt" else draw <= threshold
