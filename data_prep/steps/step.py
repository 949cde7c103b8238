"""Base class of a pipeline step (datatrove style: ``run()`` over an iterator of documents).

A step yields the documents it keeps. A document it drops is booked in the shared
:class:`~data_prep.steps.document.Ledger` with an outcome and a reason, and counted in the step's own
stats, so every step can say what it did (``docs_in``, ``docs_out``, ``dropped``, extras). A
document the step fails on (any exception) is booked as an error ``<step>.<exception class>``
(:func:`failure`) and the run goes on; with ``--strict`` it stops there.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable, Iterator

from data_prep.steps.document import Document, Ledger, StrictModeError


class PipelineStep:
    name: str = "step"

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.stats: Counter = Counter()
        self.dropped: Counter = Counter()
        self.seconds = 0.0

    # -- what subclasses implement -------------------------------------------------------
    def process(self, doc: Document) -> Document | None:
        """Return the (possibly changed) document to keep it, or None after calling drop()."""
        raise NotImplementedError

    def score_rows(self) -> list[dict[str, Any]]:
        """The rows this step records in ``DIR/scores/`` (data_prep/storage/droplog.py ``SCORE_SCHEMA``),
        one per document it checked; none by default."""
        return []

    # -- shared machinery ------------------------------------------------------------------
    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            t0 = time.perf_counter()
            self.stats["docs_in"] += 1
            try:
                out = self.process(doc)
            except StrictModeError:
                raise
            except Exception as e:  # noqa: BLE001 - one document's failure is that document's error
                # booked as `<step>.<exception class>` with its location and text; the run goes on
                self.drop(doc, "errors", failure(self.name, e))
                out = None
            self.seconds += time.perf_counter() - t0
            if out is not None:
                self.stats["docs_out"] += 1
                yield out

    def drop(
        self,
        doc: Document,
        outcome: str,
        reason: str,
        score: float | None = None,
        threshold: float | None = None,
        duplicate_of: str | None = None,
    ) -> None:
        """Book ``doc`` as dropped: the ledger's count, and a row of the drop log with the score
        that decided and its threshold (when the rule has them), and what it copies (when known)."""
        drop_document(self.ledger, self.name, doc, outcome, reason, score, threshold, duplicate_of)
        self.dropped[reason] += 1

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(sorted(self.stats.items()))
        if self.dropped:
            out["dropped"] = dict(sorted(self.dropped.items()))
        return out


class BatchStep(PipelineStep):
    """A step whose work is cheaper a batch of documents at a time (a numpy pass over many
    documents' values instead of one per document). ``process_batch`` returns the batch's
    documents, each kept or None; when it raises, the batch runs again document by document
    through ``process``, so a failure is booked against the one document it belongs to."""

    batch_size = 256
    batch_chars = 4 << 20
    """A batch also ends at this many characters of text. The numpy passes hold about 65 bytes per
    character of a batch at once (data_prep/steps/filters.py TextBatch: code points, word spans, masks;
    measured with tracemalloc on 1 MiB of text), so 256 documents of 1 MiB each, which a Parquet
    file of 1 KB can hold through a shared dictionary value, took a worker to 17.5 GB. Ordinary
    documents (a few KB) fill 256 long before 4 Mi characters, so their batches are unchanged."""

    def process_batch(self, docs: list[Document]) -> list[Document | None]:
        raise NotImplementedError

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        batch: list[Document] = []
        chars = 0
        for doc in docs:
            batch.append(doc)
            chars += len(doc.text)
            if len(batch) >= self.batch_size or chars >= self.batch_chars:
                yield from self._run_batch(batch)
                batch, chars = [], 0
        if batch:
            yield from self._run_batch(batch)

    def _run_batch(self, batch: list[Document]) -> Iterator[Document]:
        t0 = time.perf_counter()
        try:
            out = self.process_batch(batch)
        except StrictModeError:
            raise
        except Exception:  # noqa: BLE001 - find the document(s) it failed on
            self.seconds += time.perf_counter() - t0
            yield from PipelineStep.run(self, batch)
            return
        self.seconds += time.perf_counter() - t0
        self.stats["docs_in"] += len(batch)
        for doc in out:
            if doc is not None:
                self.stats["docs_out"] += 1
                yield doc


def drop_document(
    ledger: Ledger,
    stage: str,
    doc: Document,
    outcome: str,
    reason: str,
    score: float | None = None,
    threshold: float | None = None,
    duplicate_of: str | None = None,
) -> None:
    """Book ``doc`` as dropped by ``stage``: the ledger's count and a row of its drop log; an
    error under the ledger's ``strict`` stops the run instead, with one line naming the record."""
    if outcome == "errors" and ledger.strict:
        raise StrictModeError(f"{doc.loc}: {reason} (--strict stops at the first bad record)")
    ledger.drop(doc.lang, outcome, reason, doc.loc)
    if ledger.log is not None:
        ledger.log.add(
            id=doc.id,
            source=doc.loc,
            lang=doc.lang,
            stage=stage,
            outcome=outcome,
            reason=reason,
            score=score,
            threshold=threshold,
            duplicate_of=duplicate_of,
            text=doc.text,
            pos=doc.pos,
        )


def failure(step: str, e: BaseException) -> str:
    """The error reason of a document ``step`` failed on with ``e``: ``langid.ValueError``."""
    return f"{step}.{type(e).__name__}"


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
