import json

import numpy as np
import pyarrow as pa
import pytest

from bloomline.errors import DataError
from data_prep.passes.best_fit import Sample
from data_prep.storage.shards import CorruptShardError, ShardWriter, checksum_error, load_manifest


def write(tmp_path, n=2500):
    rng = np.random.default_rng(0)
    samples = [Sample(64, rng.integers(0, 100, size=int(rng.integers(1, 65))).astype(np.int32), [0]) for _ in range(n)]
    w = ShardWriter(tmp_path / "shards/train/en/x.arrow", "en", 64, "train")
    for s in samples:
        w.add(s)
    info = w.close()
    shard = {"path": "shards/train/en/x.arrow", "split": "train", "bucket": 64, "lang": "en", **info}
    return samples, shard


def test_roundtrip_with_pyarrow_and_datasets(tmp_path, shard_table):
    import datasets

    samples, shard = write(tmp_path)
    assert shard["rows"] == 2500 and shard["tokens"] == sum(len(s.ids) for s in samples)
    t = shard_table(tmp_path, shard)
    assert t.column("input_ids")[7].as_py() == samples[7].ids.tolist()
    assert t.schema.field("input_ids").type == pa.list_(pa.int32())
    ds = datasets.Dataset.from_file(str(tmp_path / shard["path"]))
    assert len(ds) == 2500 and ds[7]["input_ids"] == samples[7].ids.tolist() and ds[7]["lang"] == "en"
    assert list(tmp_path.rglob("*.tmp-*")) == []


def test_corrupt_shard_names_the_file(tmp_path):
    _, shard = write(tmp_path)
    p = tmp_path / shard["path"]
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    assert checksum_error(p, shard["sha256"]).startswith(f"shard {p} is corrupt: sha256")


def test_the_reader_checks_format_version_schema_and_rows(tmp_path):
    """read_shard, the one reader, refuses a shard of another
    format version or other columns, and one whose rows are not the manifest's, naming the file."""
    from data_prep.storage.shards import SCHEMA, read_shard

    samples, shard = write(tmp_path)
    path = tmp_path / shard["path"]
    assert sum(b.num_rows for b in read_shard(path, 2500)) == 2500
    with pytest.raises(CorruptShardError, match=r"x\.arrow: 2500 rows, the manifest says 2499"):
        read_shard(path, 2499)
    table = pa.Table.from_batches(read_shard(path, 2500))
    for meta, columns, match in (
        ({b"bloomline.format_version": b"0"}, table.columns, "written with shard format 0"),
        ({}, table.columns, "written with shard format unknown"),
        (
            {b"bloomline.format_version": b"1"},
            [c.cast(pa.list_(pa.int64())) if i in (0, 2) else c for i, c in enumerate(table.columns)],
            "its columns are not contract 1's",
        ),
    ):
        other = tmp_path / "other.arrow"
        t = pa.table(columns, names=SCHEMA.names).replace_schema_metadata(meta)
        with pa.OSFile(str(other), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        with pytest.raises(CorruptShardError, match=match):
            read_shard(other, 2500)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_shard_is_refused_before_it_is_decoded(tmp_path, codec):
    """A shard bloomline never writes, a few hundred KiB that would decode to 64 MiB, is refused from its
    messages' metadata: the process never holds the decoded batch."""
    import psutil

    from data_prep.storage.shards import SCHEMA, read_shard

    n = 16 << 20  # int32 zeros: 64 MiB decoded
    ids = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(np.zeros(n, np.int32)))
    batch = pa.record_batch(
        [ids, pa.array(["en"]), pa.array([[0]], pa.list_(pa.int32())), pa.array([n], pa.int32())], schema=SCHEMA
    )
    path = tmp_path / "bomb.arrow"
    schema = SCHEMA.with_metadata({"bloomline.format_version": "2"})
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema, options=options) as w:
        w.write_batch(batch.replace_schema_metadata(schema.metadata))
    del ids, batch
    assert path.stat().st_size < 1 << 20
    before = psutil.Process().memory_info().rss
    with pytest.raises(CorruptShardError, match=rf"^shard {path} holds compressed record batches"):
        read_shard(path, 1)
    assert psutil.Process().memory_info().rss - before < 32 << 20


def test_oversized_sample_is_refused(tmp_path):
    w = ShardWriter(tmp_path / "a.arrow", "en", 8, "train")
    with pytest.raises(ValueError):
        w.add(Sample(8, np.zeros(9, np.int32), [0]))
    w.abort()
    assert not list(tmp_path.iterdir())


def test_manifest_checks(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1}))
    with pytest.raises(DataError, match="missing keys"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format_version": 99, "tokenizer": {}, "buckets": [], "shards": [], "blend": {}, "languages": {}})
    )
    with pytest.raises(DataError, match="format_version 99"):
        load_manifest(tmp_path)
