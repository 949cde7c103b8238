"""A pipeline step's failure on one document is that document's error (data_prep/steps/step.py)."""

import pytest

from data_prep.steps.document import Document, Ledger, StrictModeError
from data_prep.steps.step import PipelineStep
from data_prep.storage.droplog import DropLog


class Fussy(PipelineStep):
    """A step that cannot handle one document (as a step meeting an input it was not written for)."""

    name = "langid"

    def process(self, doc):
        if "\u202e" in doc.text:
            raise ValueError("cannot classify right-to-left override")
        return doc


def docs():
    return [
        Document(text=t, lang="en", id=f"d{i}", loc=f"f.jsonl:{i + 1}")
        for i, t in enumerate(["plain", "evil \u202e text", "plain again"])
    ]


def test_a_step_that_fails_on_a_document_books_it_and_goes_on():
    ledger = Ledger(DropLog(100))
    for _ in docs():
        ledger.record_in("en")
    step = Fussy(ledger)
    kept = list(step.run(docs()))
    assert [d.id for d in kept] == ["d0", "d2"]
    for d in kept:
        ledger.keep("en", len(d.text), 1)
    assert ledger.to_dict()["en"]["errors"] == {"langid.ValueError": 1}
    assert ledger.to_dict()["en"]["error_examples"] == {"langid.ValueError": "f.jsonl:2"}
    (row,) = ledger.log.rows
    assert (row["stage"], row["reason"], row["source"], row["text"]) == (
        "langid",
        "langid.ValueError",
        "f.jsonl:2",
        "evil \u202e text",
    )
    assert step.report() == {"docs_in": 3, "docs_out": 2, "dropped": {"langid.ValueError": 1}}
    assert not ledger.check_balance()


def test_strict_stops_at_the_document_with_one_line():
    with pytest.raises(
        StrictModeError, match=r"^f.jsonl:2: langid.ValueError \(--strict stops at the first bad record\)$"
    ):
        list(Fussy(Ledger(strict=True)).run(docs()))


def test_a_batch_step_books_the_one_document_its_batch_failed_on():
    """A batch that raises runs again document by document: the others are kept, in order."""
    from data_prep.steps.step import BatchStep

    class FussyBatch(BatchStep):
        name = "langid"
        batch_size = 2

        def process_batch(self, batch):
            return [self.process(d) for d in batch]

        process = Fussy.process

    ledger = Ledger(DropLog(100))
    step = FussyBatch(ledger)
    assert [d.id for d in step.run(docs())] == ["d0", "d2"]
    assert ledger.to_dict()["en"]["errors"] == {"langid.ValueError": 1}
    assert step.report() == {"docs_in": 3, "docs_out": 2, "dropped": {"langid.ValueError": 1}}


def test_a_batch_ends_at_its_character_budget_as_well_as_its_document_count():
    """256 documents of 1 MiB each (a 1 KB Parquet file's shared dictionary value can be that)
    would be one batch of 256 MiB of text, which the quality checks' numpy passes multiply by ~65:
    batches end at ``batch_chars`` too, and ordinary documents still go 256 at a time."""
    from data_prep.steps.filters import QualityFilter

    sizes = []

    class Sizes(QualityFilter):
        def process_batch(self, batch):
            sizes.append(len(batch))
            return batch

    def many(n, chars):
        return (Document(text="a" * chars, lang="en", id=f"d{i}", loc=f"f:{i}", pos=i) for i in range(n))

    from data_prep.config import FilterConfig

    step = Sizes(FilterConfig(), Ledger(DropLog(100)))
    assert len(list(step.run(many(10, 1 << 20)))) == 10 and sizes == [4, 4, 2]  # 4 MiB of text each
    sizes.clear()
    assert len(list(step.run(many(300, 3000)))) == 300 and sizes == [256, 44]
