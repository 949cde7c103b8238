import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bloomline.errors import DataError
from data_prep.config import ReadConfig, SourceConfig
from data_prep.inputs.chunk_plan import plan_chunks
from data_prep.inputs.readers import ChunkReader
from data_prep.steps.document import UNKNOWN_LANG, Ledger, StrictModeError


def read_all(path, cfg=None, strict=False, **src):
    cfg = cfg or ReadConfig()
    ledger = Ledger(strict=strict)
    docs = []
    for chunk in plan_chunks([SourceConfig(path=str(path), **src)], cfg):
        docs.extend(ChunkReader(chunk, cfg, ledger).run())
    return docs, ledger


def test_bad_records_are_booked_with_reason_and_location(tmp_path, bad_inputs):
    f = tmp_path / "bad.jsonl"
    expected = bad_inputs(f)
    docs, ledger = read_all(f)
    assert [d.id for d in docs] == ["ok-1", "s"]  # the surrogate text is caught by the normalize step
    led = ledger.to_dict()
    errors = {**led[UNKNOWN_LANG]["errors"], **led["en"]["errors"], **led.get("fr", {}).get("errors", {})}
    for reason in expected:
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


def test_a_language_outside_blooms_is_read_under_its_iso_code(tmp_path):
    """de, deu_Latn and kor_Hang are languages like BLOOM's (bloomline/languages.py): read, booked under
    one code each; a label that names no language is still booked unknown_lang."""
    f = tmp_path / "extra.jsonl"
    rows = [("a", "de"), ("b", "deu_Latn"), ("c", "kor_Hang"), ("d", "tr"), ("e", "xx")]
    f.write_text("".join(json.dumps({"id": i, "text": f"text {i}", "lang": lang}) + "\n" for i, lang in rows))
    docs, ledger = read_all(f)
    assert [(d.id, d.lang) for d in docs] == [("a", "de"), ("b", "de"), ("c", "ko"), ("d", "tr")]
    led = ledger.to_dict()
    assert led[UNKNOWN_LANG]["errors"] == {"unknown_lang": 1} and led["de"]["docs_in"] == 2


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


GOOD = [
    {"id": f"g{i}", "text": f"a perfectly ordinary sentence number {i} of this test", "lang": "en"} for i in range(4)
]


def jsonl(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def test_a_deeply_nested_line_is_booked_and_the_run_goes_on(tmp_path):
    """5,000 levels of valid JSON, which Python's json cannot parse (RecursionError): one error of
    its own reason, with its line and raw text; the records around it read. --strict stops there."""
    f = tmp_path / "deep.jsonl"
    deep = "[" * 5000 + "]" * 5000
    f.write_bytes(jsonl(json.dumps(GOOD[0]), deep, json.dumps(GOOD[1]), "{" * 3000 + "}" * 3000, json.dumps(GOOD[2])))
    from data_prep.storage.droplog import DropLog

    cfg, ledger = ReadConfig(), Ledger(DropLog(40))
    chunk = plan_chunks([SourceConfig(path=str(f))], cfg)[0]
    reader = ChunkReader(chunk, cfg, ledger)
    docs = list(reader.run())
    assert [d.id for d in docs] == ["g0", "g1", "g2"]
    led = ledger.to_dict()[UNKNOWN_LANG]
    assert led["errors"] == {"too_deep": 1, "malformed_json": 1} and led["error_examples"]["too_deep"] == f"{f}:2"
    assert ledger.totals()["docs_in"] == 5 and reader.report()["records"] == 5
    assert [r["text"] for r in ledger.log.rows][0] == "[" * 40  # the raw line's first characters
    with pytest.raises(StrictModeError, match=r"deep.jsonl:2: too_deep \(--strict"):
        read_all(f, strict=True)


def test_a_truncated_gzip_keeps_what_came_before_and_books_the_break(tmp_path):
    """A .jsonl.gz cut in half: its first lines read, then one error naming the file and the byte
    of its text where it broke. Its size, for the memory check, is what it decompresses to (its
    trailer, the last 4 bytes, is just data: it read as 1,948 MiB)."""
    from data_prep.config import PrepareConfig
    from data_prep.inputs.chunk_plan import chunk_bytes
    from data_prep.inputs.gzipped import gzip_text_size
    from data_prep.passes.budget import check_inputs

    recs = [
        {"id": f"r{i}", "text": f"line {i} of a long gzip file, with some words in it", "lang": "en"}
        for i in range(300)
    ]
    whole = gzip.compress(jsonl(*map(json.dumps, recs)))
    f = tmp_path / "cut.jsonl.gz"
    f.write_bytes(whole[: len(whole) // 2])
    size = gzip_text_size(f)
    assert size.truncated and not size.exact and 0 < size.text_bytes < len(jsonl(*map(json.dumps, recs)))
    assert chunk_bytes(f, "jsonl.gz", ReadConfig()) == (size.text_bytes, "decompressed up to where it breaks")
    check_inputs(PrepareConfig(sources=[SourceConfig(path=str(f))]))  # no "raise memory_gib" for a broken file
    docs, ledger = read_all(f)
    assert 50 < len(docs) < 300 and [d.id for d in docs] == [f"r{i}" for i in range(len(docs))]
    led = ledger.to_dict()[UNKNOWN_LANG]
    assert led["errors"] == {"truncated_gzip": 1}
    assert (
        led["error_examples"]["truncated_gzip"].startswith(f"{f}: at byte ")
        and "EOFError" in led["error_examples"]["truncated_gzip"]
    )
    with pytest.raises(
        StrictModeError, match=r"cut.jsonl.gz: at byte [\d,]+ of its text, after line [\d,]+ \(EOFError"
    ):
        read_all(f, strict=True)


def test_a_gzip_over_4_gib_is_measured_past_its_trailers_wrap(tmp_path):
    """ISIZE is the size modulo 4 GiB: a 4.5 GiB text read as 0.5 GiB, and passed a memory check
    it should fail. The estimate agrees a decompressed prefix with the trailer's candidates."""
    import zlib

    from data_prep.inputs.gzipped import gzip_text_size

    unit = (json.dumps({"text": "word " * 6000, "lang": "en"}) + "\n").encode() * 35
    n = ((4 << 30) + (512 << 20)) // len(unit)  # 4.5 GiB of text, about 25 MB compressed
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    f = tmp_path / "big.jsonl.gz"
    with open(f, "wb") as out:
        for _ in range(n):
            out.write(c.compress(unit))
        out.write(c.flush())
    true = n * len(unit)
    trailer = int.from_bytes(f.read_bytes()[-4:], "little")
    assert true > 4 << 30 and trailer == true % (1 << 32)  # what the trailer alone says
    size = gzip_text_size(f)
    assert size.exact and size.text_bytes == true and "1 × 4 GiB past what the trailer holds" in size.how


def test_a_broken_parquet_row_group_is_one_error_and_the_others_read(tmp_path):
    """A row group whose page header is damaged fails to decode: its rows are one error naming the
    group and its rows; the groups before and after it are read."""
    recs = [{"id": f"p{i}", "text": f"parquet row number {i} with words", "lang": "en"} for i in range(30)]
    f = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pylist(recs), f, row_group_size=10, compression="none")
    col = pq.ParquetFile(f).metadata.row_group(1).column(1)  # the text column of the middle group
    raw = bytearray(f.read_bytes())
    raw[col.data_page_offset : col.data_page_offset + 16] = b"\xff" * 16
    f.write_bytes(bytes(raw))
    docs, ledger = read_all(f)
    assert [d.id for d in docs] == [f"p{i}" for i in [*range(10), *range(20, 30)]]
    led = ledger.to_dict()[UNKNOWN_LANG]
    assert sum(led["errors"].values()) == 1 and list(led["errors"]) == ["unreadable"]
    assert led["error_examples"]["unreadable"].startswith(f"{f}: row group 1 (rows 10 to 19) from row 10 (")
    with pytest.raises(StrictModeError, match=r"broken.parquet: row group 1 \(rows 10 to 19\)"):
        read_all(f, strict=True)
    # a Parquet text column of integers is still booked, not raised
    pq.write_table(pa.table({"text": [1, 2], "lang": ["en", "en"]}), tmp_path / "ints.parquet")
    docs, ledger = read_all(tmp_path / "ints.parquet")
    assert docs == [] and ledger.to_dict()["en"]["errors"] == {"text_not_string": 2}
