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

from bench.fuzz_inputs import dictionary_bomb, write_saved_dataset
from data_prep.config import ReadConfig, SourceConfig
from data_prep.document import UNKNOWN_LANG, Ledger
from data_prep.droplog import DropLog
from data_prep.readers import ChunkReader, plan_chunks

REPO = Path(__file__).resolve().parents[2]
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


@pytest.mark.slow
def test_prepare_on_a_dictionary_bomb_keeps_every_process_under_2_gib(tmp_path):
    """The full-size bomb: one 8 MiB value (one byte over read.max_doc_bytes) that 1,024 rows point
    at, as Parquet and as a saved dataset, through the real CLI (Prefect flow, two Dask workers)."""
    from bench.proctree import run_sampled

    refs = 1024
    inputs = bombs(tmp_path, (8 << 20) + 1, refs)
    assert inputs[0].stat().st_size < 16 << 10  # a few KB on disk
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flows.cli", "prepare", "--out", str(out), *map(str, inputs)]
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
