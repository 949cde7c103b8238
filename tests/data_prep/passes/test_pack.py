"""The pack pass's failures on one document are that document's (data_prep/passes/pack.py): the
stage's dependencies are made to fail on marked documents, the stage itself runs for real."""

import json
from pathlib import Path

import pytest

from bloomline.config import load_config
from data_prep.config import PrepareConfig, SourceConfig
from data_prep.steps.document import StrictModeError
from data_prep.storage.droplog import DROPPED_DIR

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def marked(tmp_path, monkeypatch):
    """The English sample with two documents marked, PII redaction failing on one and the
    tokenizer on the other (as a library meeting input it was not written for)."""
    import data_prep.passes.pack as pack_parts
    import data_prep.steps.pii as pii

    src = tmp_path / "in"
    src.mkdir()
    docs = [json.loads(l) for l in (REPO / "data_prep/sample_corpus/text/en.jsonl").read_text().splitlines()]
    docs[2]["text"] += " MARK-PII"
    docs[5]["text"] += " MARK-TOKENIZE"
    (src / "en.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    real_redact, real_open = pii.redact, pack_parts.open_tokenizer

    def redact(text, kinds):
        if "MARK-PII" in text:
            raise ValueError("a pattern this text breaks")
        return real_redact(text, kinds)

    class Tokenizer:
        def __init__(self, tok):
            self.tok = tok

        def encode_batch(self, texts):
            if any("MARK-TOKENIZE" in t for t in texts):
                raise RuntimeError("the tokenizer failed")
            return self.tok.encode_batch(texts)

    monkeypatch.setattr(pii, "redact", redact)
    monkeypatch.setattr(pack_parts, "open_tokenizer", lambda *a: Tokenizer(real_open(*a)))
    cfg = load_config(
        PrepareConfig, REPO / "configs/data/demo.yaml", ["langid.enabled=false", "tokenizer.vocab_size=1000"]
    )
    cfg.sources = [SourceConfig(path=str(src))]
    return cfg, docs


def test_a_document_pii_or_the_tokenizer_fails_on_is_booked_and_the_rest_packed(marked, tmp_path):
    from data_prep.pipeline import run_all
    from data_prep.storage.droplog import dropped_counts

    cfg, docs = marked
    m = run_all(cfg, tmp_path / "out")
    en = m["languages"]["en"]
    assert en["errors"] == {"pii.ValueError": 1, "tokenize.RuntimeError": 1}
    assert en["docs_in"] == len(docs) and en["docs_kept"] == len(docs) - 2 - sum(en["filtered"].values())
    assert en["error_examples"]["pii.ValueError"].endswith("en.jsonl:3")
    assert dropped_counts(tmp_path / "out")["en"]["errors"] == en["errors"]  # the drop log has their rows
    files = sorted(p.name for p in (tmp_path / "out" / DROPPED_DIR).glob("pack-*.parquet"))
    assert files == ["pack-en-p00000.parquet"]


def test_strict_stops_at_the_first_with_one_line(marked, tmp_path):
    from data_prep.pipeline import run_all

    cfg, _ = marked
    cfg.strict = True
    with pytest.raises(StrictModeError, match=r"en.jsonl:3: pii.ValueError \(--strict stops at the first bad record\)"):
        run_all(cfg, tmp_path / "out")
