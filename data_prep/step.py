"""Base class of a pipeline step (datatrove style: ``run()`` over an iterator of documents).

A step yields the documents it keeps. A document it drops is booked in the shared
:class:`~data_prep.document.Ledger` with an outcome and a reason, and counted in the step's own
stats, so every step can say what it did (``docs_in``, ``docs_out``, ``dropped``, extras).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable, Iterator

from data_prep.document import Document, Ledger, StrictModeError


class PipelineStep:
    name: str = "step"

    def __init__(self, ledger: Ledger, strict: bool = False):
        self.ledger = ledger
        self.strict = strict
        self.stats: Counter = Counter()
        self.dropped: Counter = Counter()
        self.seconds = 0.0

    # -- what subclasses implement -------------------------------------------------------
    def process(self, doc: Document) -> Document | None:
        """Return the (possibly changed) document to keep it, or None after calling drop()."""
        raise NotImplementedError

    # -- shared machinery ------------------------------------------------------------------
    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            t0 = time.perf_counter()
            self.stats["docs_in"] += 1
            out = self.process(doc)
            self.seconds += time.perf_counter() - t0
            if out is not None:
                self.stats["docs_out"] += 1
                yield out

    def drop(self, doc: Document, outcome: str, reason: str, score: float | None = None,
             threshold: float | None = None) -> None:
        """Book ``doc`` as dropped: the ledger's count, and a row of the drop log with the score
        that decided and its threshold (when the rule has them)."""
        if outcome == "errors" and self.strict:
            raise StrictModeError(f"{doc.loc}: {reason} (--strict stops at the first bad record)")
        self.dropped[reason] += 1
        self.ledger.drop(doc.lang, outcome, reason, doc.loc)
        if self.ledger.log is not None:
            self.ledger.log.add(id=doc.id, source=doc.loc, lang=doc.lang, stage=self.name, outcome=outcome,
                                reason=reason, score=score, threshold=threshold, text=doc.text)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(sorted(self.stats.items()))
        if self.dropped:
            out["dropped"] = dict(sorted(self.dropped.items()))
        return out


def merge_reports(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sum step reports of several chunks (numbers add, nested dicts merge, lists union)."""
    total: dict[str, Any] = {}
    for rep in reports:
        for k, v in rep.items():
            if isinstance(v, dict):
                total[k] = merge_reports([total.get(k, {}), v])
            elif isinstance(v, list):
                total[k] = sorted(set(total.get(k, [])) | set(v))
            else:
                total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))
