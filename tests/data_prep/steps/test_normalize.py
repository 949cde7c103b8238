import unicodedata

from data_prep.steps.document import Document, Ledger
from data_prep.steps.normalize import Normalizer, normalize_text


def test_nfc_and_controls():
    decomposed = "cafe\u0301"  # e + combining acute
    assert normalize_text(decomposed) == "caf\u00e9"
    assert normalize_text("a\x00b\x07c\r\nd\re\tf\x85g") == "abc\nd\ne\tfg"
    assert unicodedata.is_normalized("NFC", normalize_text("ệ\u0323"))


def test_errors_are_booked_not_raised():
    ledger = Ledger()
    docs = [
        Document("ok text", "en", "1", "f:1"),
        Document("bad \ud800", "en", "2", "f:2"),
        Document("\x00\x01", "en", "3", "f:3"),
    ]
    for d in docs:
        ledger.record_in(d.lang)
    step = Normalizer(ledger)
    out = list(step.run(docs))
    assert [d.id for d in out] == ["1"]
    assert ledger.to_dict()["en"]["errors"] == {"empty_after_normalize": 1, "invalid_unicode": 1}
    assert step.report()["dropped"] == {"empty_after_normalize": 1, "invalid_unicode": 1}
