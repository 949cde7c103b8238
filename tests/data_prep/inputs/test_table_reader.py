"""Parquet and Arrow rows are read without decoding more than a bound: a dictionary bomb (a few KB
of file, gigabytes as Python strings) is booked ``too_long`` row by row, its ordinary rows kept,
and every process of ``prepare`` stays small (issue 37, item 5)."""

import json
import os
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from data_prep.config import PrepareConfig, ReadConfig, SourceConfig
from data_prep.inputs.chunk_plan import chunk_bytes, plan_chunks
from data_prep.inputs.readers import ChunkReader
from data_prep.inputs.table_reader import batch_bound
from data_prep.passes.budget import BudgetError, check_inputs
from data_prep.steps.document import UNKNOWN_LANG, Ledger
from data_prep.storage.droplog import DropLog
from tests.support.fuzz_inputs import STREAM_COMPRESSIONS, dictionary_bomb, write_saved_dataset

REPO = Path(__file__).resolve().parents[3]
ORDINARY = [json.loads(line) for line in (REPO / "data_prep/sample_corpus/text/en.jsonl").read_text().splitlines()]


def bombs(folder: Path, value_bytes: int, refs: int) -> list[Path]:
    """The bomb as Parquet (without pyarrow's stored schema: the reader must ask for dictionaries)
    and as a saved dataset, each with half the ordinary English records after the bomb's rows."""
    half = len(ORDINARY) // 2
    pq.write_table(
        dictionary_bomb(value_bytes, refs, ORDINARY[:half]),
        folder / "bomb.parquet",
        store_schema=False,
        compression="zstd",
    )
    write_saved_dataset(folder / "bomb-ds", dictionary_bomb(value_bytes, refs, ORDINARY[half:]))
    return [folder / "bomb.parquet", folder / "bomb-ds"]


def read(path: Path, cfg: ReadConfig):
    ledger = Ledger(DropLog(500))
    docs = []
    for chunk in plan_chunks([SourceConfig(path=str(path))], cfg):
        docs.extend(ChunkReader(chunk, cfg, ledger).run())
    return docs, ledger


def test_a_dictionary_bomb_is_booked_too_long_row_by_row_without_being_decoded(tmp_path):
    limit = 256 << 10
    cfg = ReadConfig(max_doc_bytes=limit)
    for path, ordinary in zip(bombs(tmp_path, limit + 1, 2048), (ORDINARY[:4], ORDINARY[4:])):
        tracemalloc.start()
        docs, ledger = read(path, cfg)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 << 20, f"{path.name}: {peak / 2**20:.0f} MiB of Python objects"  # decoded: 512 MiB
        assert [d.id for d in docs] == [r["id"] for r in ordinary]
        assert ledger.to_dict()["en"]["errors"] == {"too_long": 2048}
        rows = ledger.log.rows
        value = dictionary_bomb(limit + 1, 1, []).column("text")[0].as_py()
        assert [r["source"].rsplit(":", 1)[1] for r in rows] == [f"row {k}" for k in range(2048)]
        assert {(r["lang"], r["reason"], r["text"]) for r in rows} == {("en", "too_long", value[:256])}


def test_a_bomb_within_the_row_limit_is_read_only_to_its_expansion_bound(tmp_path):
    """Rows each within read.max_doc_bytes that repeat one value: the file is read while its rows
    decode to at most read.max_expansion times its size (64 MiB at least), the rest one error
    ``expansion`` naming them, undecoded: bounded in time as well as in memory."""
    import time

    value = 512 << 10  # each row within the limit; 1,024 of them: 512 MiB from a file of a few KB
    for path in bombs(tmp_path, value, 1024):
        t0 = time.perf_counter()
        docs, ledger = read(path, ReadConfig(max_doc_bytes=1 << 20))
        took = time.perf_counter() - t0
        assert len(docs) <= 128 and all(d.id.startswith("bomb-") for d in docs), path.name  # 64 MiB decoded
        errors = ledger.to_dict()[UNKNOWN_LANG]["errors"]
        assert errors == {"expansion": 1}, errors
        (row,) = [r for r in ledger.log.rows if r["reason"] == "expansion"]
        assert f"from row {len(docs)}" in row["source"] or f"rows {len(docs)} to 1,0" in row["source"], row
        assert "read.max_expansion=100 times the file's" in row["source"]
        assert took < 30, f"{path.name}: {took:.0f} s"


def test_fields_over_the_limit_are_booked_as_a_decoded_record_would_be(tmp_path):
    """A long blank text is empty_text, a long text of another type text_not_string, a long id
    or label too_long (as a JSONL line over the limit): none of them decoded."""
    big = "w " * 3000
    ref = lambda v, n: pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([v]))  # noqa: E731
    ok = "an ordinary sentence of words"
    rows = [
        {"text": pa.array([" " * 6000]), "lang": pa.array(["en"]), "id": pa.array(["blank"])},
        {"text": pa.array([[big] * 3]), "lang": pa.array(["en"]), "id": pa.array(["list"])},
        {"text": pa.array([ok]), "lang": ref(big, 1), "id": pa.array(["label"])},
        {"text": pa.array([ok]), "lang": pa.array(["en"]), "id": ref(big, 1)},
        {"text": pa.array([big]), "lang": pa.array([None], pa.string()), "id": pa.array(["nolang"])},
    ]
    cfg = ReadConfig(max_doc_bytes=4096)
    for i, cols in enumerate(rows):
        pq.write_table(pa.table(cols), tmp_path / f"r{i}.parquet", store_schema=False)
    docs, ledger = read(tmp_path, cfg)
    assert docs == []
    led = ledger.to_dict()
    assert led["en"]["errors"] == {"empty_text": 1, "text_not_string": 1}
    assert led[UNKNOWN_LANG]["errors"] == {"too_long": 2, "missing_lang": 1}
    texts = {r["reason"]: r["text"] for r in ledger.log.rows}
    assert texts["empty_text"] == " " * 500 and texts["missing_lang"] == big[:500]  # as a decoded record's


def test_a_table_with_none_of_the_fields_books_every_row(tmp_path):
    """No text, label or id column: each row is still a record, booked (it read as no record at all)."""
    pq.write_table(pa.table({"foo": [1, 2, 3]}), tmp_path / "x.parquet")
    write_saved_dataset(tmp_path / "ds", pa.table({"foo": [1, 2]}))
    docs, ledger = read(tmp_path, ReadConfig())
    assert docs == [] and ledger.to_dict()[UNKNOWN_LANG]["errors"] == {"missing_lang": 5}


def test_a_compressed_batch_over_the_bound_is_booked_undecoded_and_the_next_one_read(tmp_path):
    """A saved dataset whose first batch is 80 MiB of text in 10 KB of ZSTD, which pyarrow would
    decompress whole before any row is measured: one ``too_long`` naming its rows, found from the
    stream's metadata, and the ordinary batch after it read. The budget counts the file's size."""
    n, cfg = 320, ReadConfig()
    bomb = pa.table({"id": [f"bomb-{i}" for i in range(n)], "text": pa.repeat("bomb " * ((256 << 10) // 5), n)})
    ordinary = pa.Table.from_pylist(ORDINARY).select(["id", "text", "lang"])
    table = pa.concat_tables([bomb.append_column("lang", pa.repeat("en", n)), ordinary])
    assert table.column("text").nbytes > batch_bound(cfg.max_doc_bytes)
    write_saved_dataset(tmp_path / "ds", table, "zstd", batch_rows=n)
    del bomb, table
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    assert arrow.stat().st_size < 64 << 10
    default, pool = pa.default_memory_pool(), pa.proxy_memory_pool(pa.default_memory_pool())
    pa.set_memory_pool(pool)  # what pyarrow allocates while reading (the decompressed buffers)
    tracemalloc.start()
    try:
        docs, ledger = read(tmp_path / "ds", cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(default)
    assert pool.max_memory() < 4 << 20 and peak < 16 << 20, (pool.max_memory(), peak)  # decoded: 80 MiB
    assert [d.id for d in docs] == [r["id"] for r in ORDINARY]
    assert ledger.to_dict()[UNKNOWN_LANG]["errors"] == {"too_long": 1}
    [row] = ledger.log.rows
    assert row["source"].startswith(f"{arrow}:rows 0 to {n - 1} (a compressed record batch, ")
    assert chunk_bytes(arrow, "arrow", cfg) == (arrow.stat().st_size, "its size")  # what is read: nothing of it


def test_a_compressed_dictionary_over_the_bound_ends_the_file_there_undecoded(tmp_path):
    """A dictionary is needed by the batches after it: one over the bound (70 MiB in a few KB) ends
    the file with one ``too_long``, the rows before it kept."""
    ordinary = pa.Table.from_pylist(ORDINARY[:4]).select(["id", "text", "lang"])
    first = ordinary.set_column(1, "text", ordinary.column("text").dictionary_encode())
    big = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["y" * (70 << 20)]))
    second = pa.table({"id": ["y1", "y2"], "text": big, "lang": ["en", "en"]})
    write_saved_dataset(tmp_path / "ds", pa.concat_tables([first, second]), "zstd", batch_rows=4)
    del big, second
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    default, pool = pa.default_memory_pool(), pa.proxy_memory_pool(pa.default_memory_pool())
    pa.set_memory_pool(pool)
    try:
        docs, ledger = read(tmp_path / "ds", ReadConfig())
    finally:
        pa.set_memory_pool(default)
    assert pool.max_memory() < 4 << 20, pool.max_memory()
    assert [d.id for d in docs] == [r["id"] for r in ORDINARY[:4]]
    assert ledger.to_dict()[UNKNOWN_LANG]["errors"] == {"too_long": 1}
    assert ledger.log.rows[0]["source"].startswith(f"{arrow}: from row 4 (a compressed dictionary batch, ")


def test_a_compressed_saved_dataset_reads_as_the_plain_one_and_is_budgeted_decoded(tmp_path):
    """LZ4 or ZSTD, the same documents, rows and books as uncompressed; and the memory check counts
    a compressed stream at what its batches decode to, not its size on disk."""
    table = pa.Table.from_pylist(ORDINARY)
    got = {}
    for comp in STREAM_COMPRESSIONS:
        write_saved_dataset(tmp_path / f"ds-{comp}", table, comp)
        docs, ledger = read(tmp_path / f"ds-{comp}", ReadConfig())
        got[comp] = [(d.id, d.text, d.lang, d.loc.rsplit(":", 1)[1]) for d in docs], ledger.to_dict()
    assert got["lz4"] == got["zstd"] == got[None] and len(got[None][0]) == len(ORDINARY)
    # 96 batches of one 1 MiB text: at 8 bytes per byte decoded, more than memory_gib=0.75 leaves a task
    text = pa.repeat("words " * ((1 << 20) // 6), 96)
    write_saved_dataset(tmp_path / "big", pa.table({"text": text, "lang": pa.repeat("en", 96)}), "zstd", 1)
    arrow = tmp_path / "big" / "data-00000-of-00001.arrow"
    size, how = chunk_bytes(arrow, "arrow", ReadConfig())
    assert size >= text.nbytes > 100 * arrow.stat().st_size and how == "its batches' decoded sizes"
    with pytest.raises(BudgetError, match=r"about 96 MiB of records \(its batches' decoded sizes\)"):
        check_inputs(PrepareConfig(sources=[SourceConfig(path=str(tmp_path / "big"))], memory_gib=0.75))


def test_a_stream_batch_that_does_not_hold_together_ends_the_file_not_the_process(tmp_path):
    """pyarrow checks little of what it reads from a stream: offsets past their data made Python
    crash (a segmentation fault) or raise from inside pyarrow. Each batch is checked first: the
    rows before it stand, and the file ends there with one error."""
    bad = pa.table({"id": ["x1", "x2", "x3"], "text": ["aaaa", "bbbb", "cccc"], "lang": ["en"] * 3})
    table = pa.concat_tables([pa.Table.from_pylist(ORDINARY[:4]).select(bad.column_names), bad])
    write_saved_dataset(tmp_path / "ds", table, batch_rows=4)
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    offsets = b"".join(k.to_bytes(4, "little") for k in (0, 4, 8, 12))
    assert arrow.read_bytes().count(offsets) == 1
    arrow.write_bytes(arrow.read_bytes().replace(offsets, offsets[:4] + (12).to_bytes(4, "little") + offsets[8:]))
    docs, ledger = read(tmp_path / "ds", ReadConfig())
    assert [d.id for d in docs] == [r["id"] for r in ORDINARY[:4]]
    led = ledger.to_dict()[UNKNOWN_LANG]
    assert led["errors"] == {"unreadable": 1}
    assert led["error_examples"]["unreadable"].startswith(f"{arrow}: at row 4 (ArrowInvalid: ")


@pytest.mark.slow
def test_prepare_on_a_dictionary_bomb_keeps_every_process_under_2_gib(tmp_path):
    """The full-size bomb: one 8 MiB value (one byte over read.max_doc_bytes) that 1,024 rows point
    at, as Parquet and as a saved dataset, through the real CLI (Prefect flow, two Dask workers)."""
    from tests.support.proctree import run_sampled

    refs = 1024
    inputs = bombs(tmp_path, (8 << 20) + 1, refs)
    assert inputs[0].stat().st_size < 16 << 10  # a few KB on disk
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flows.cli.app", "prepare", "--out", str(out), *map(str, inputs)]
    cmd += ["--config", str(REPO / "configs/data/demo.yaml")]
    cmd += ["-o", "dask.n_workers=2", "-o", "tokenizer.vocab_size=500"]
    cmd += ["-o", "dask.memory_limit=2GiB"]  # should this regress, a worker is stopped, not the machine
    res = run_sampled(cmd, REPO, env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert res.returncode == 0, res.stderr[-3000:]
    peaks = {f"{res.roles[p]} {p}": round(v) for p, v in res.peaks.items()}
    assert res.count("worker") >= 2 and max(peaks.values()) < 2048, peaks
    en = json.loads((out / "manifest.json").read_text())["languages"]["en"]
    assert en["errors"] == {"too_long": 2 * refs} and en["docs_kept"] == len(ORDINARY)
    dropped = ds.dataset(out / "dropped").to_table().to_pylist()
    too_long = sorted(r["source"] for r in dropped if r["reason"] == "too_long")
    assert too_long == sorted(f"{p}:row {k}" for p in (inputs[0], next(inputs[1].glob("*.arrow"))) for k in range(refs))
