import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bloomline.errors import DataError
from data_prep.config import ReadConfig, SourceConfig
from data_prep.document import UNKNOWN_LANG, Ledger, StrictModeError
from data_prep.readers import ChunkReader, plan_chunks


def read_all(path, cfg=None, strict=False, **src):
    cfg = cfg or ReadConfig()
    ledger = Ledger()
    docs = []
    for chunk in plan_chunks([SourceConfig(path=str(path), **src)], cfg):
        docs.extend(ChunkReader(chunk, cfg, ledger, strict).run())
    return docs, ledger


def test_bad_records_are_booked_with_reason_and_location(tmp_path, bad_inputs):
    f = tmp_path / "bad.jsonl"
    expected = bad_inputs(f)
    docs, ledger = read_all(f)
    assert [d.id for d in docs] == ["ok-1", "s"]  # the surrogate text is caught by the normalize step
    led = ledger.to_dict()
    errors = {**led[UNKNOWN_LANG]["errors"], **led["en"]["errors"], **led.get("fr", {}).get("errors", {})}
    for reason, line in expected.items():
        if reason == "invalid_unicode":
            continue
        assert reason in errors, reason
    examples = {**led[UNKNOWN_LANG]["error_examples"], **led["en"]["error_examples"], **led["fr"]["error_examples"]}
    assert examples["malformed_json"] == f"{f}:2"
    assert examples["too_long"] == f"{f}:6"
    assert examples["unknown_lang"].startswith(f"{f}:8")
    assert led["fr"]["errors"] == {"invalid_utf8": 1}  # booked under its language
    # the binary junk line is one record, an error of some kind
    assert sum(ledger.totals()[k] for k in ("errors",)) == 10 - 1 + 1  # 9 reasons above + binary junk
    assert ledger.totals()["docs_in"] == 12


def test_strict_mode_stops_at_the_first_bad_record(tmp_path, bad_inputs):
    f = tmp_path / "bad.jsonl"
    bad_inputs(f)
    with pytest.raises(StrictModeError, match=r"bad.jsonl:2: malformed_json"):
        read_all(f, strict=True)


def test_chunks_cut_at_lines_and_number_lines_right(tmp_path):
    f = tmp_path / "a.jsonl"
    recs = [{"id": str(i), "text": f"document number {i} " * (i % 7 + 1), "lang": "en"} for i in range(500)]
    f.write_text("".join(json.dumps(r) + "\n" + ("\n" if i % 50 == 0 else "") for i, r in enumerate(recs)))
    cfg = ReadConfig(chunk_bytes=2048)
    chunks = plan_chunks([SourceConfig(path=str(f))], cfg)
    assert len(chunks) > 10
    assert chunks[0].start == 0 and all(a.end == b.start for a, b in zip(chunks, chunks[1:]))
    docs, ledger = read_all(f, cfg)
    assert [d.id for d in docs] == [str(i) for i in range(500)]
    # line numbers include the blank lines
    lines = f.read_text().split("\n")
    for d in docs[::37]:
        line = int(d.loc.rsplit(":", 1)[1])
        assert json.loads(lines[line - 1])["id"] == d.id
    assert ledger.totals()["docs_in"] == 500


def test_gzip_parquet_and_saved_dataset(tmp_path):
    import datasets

    recs = [{"text": f"texto número {i}", "lang": "es", "id": i} for i in range(20)]
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as g:
        g.write("".join(json.dumps(r) + "\n" for r in recs))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "b.parquet")
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "ds"))
    for p in ("a.jsonl.gz", "b.parquet", "ds"):
        docs, _ = read_all(tmp_path / p)
        assert len(docs) == 20 and docs[3].text == "texto número 3" and docs[3].lang == "es", p
    # a folder finds all three
    docs, _ = read_all(tmp_path)
    assert len(docs) == 60


def test_configurable_fields_and_forced_language(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"content": "def f():\n    return 1\n", "language": "python"}) + "\n")
    docs, _ = read_all(f, ReadConfig(text_field="content", lang_field="language"))
    assert docs[0].lang == "code-python"
    docs, _ = read_all(f, ReadConfig(text_field="content"), lang="ruby")
    assert docs[0].lang == "code-ruby"


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="input not found"):
        plan_chunks([SourceConfig(path=str(tmp_path / "nope"))], ReadConfig())
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="unsupported input file"):
        plan_chunks([SourceConfig(path=str(tmp_path / "x.txt"))], ReadConfig())
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no input files"):
        plan_chunks([SourceConfig(path=str(tmp_path / "empty"))], ReadConfig())
