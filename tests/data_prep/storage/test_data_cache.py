"""Prepared data at an S3 URL read through a node's bounded cache (data_prep/storage/data_cache.py),
on the loopback S3 server: the bound holds, every cached shard is the prepared one, a corrupt
object is refused naming its URL, a changed manifest empties the cache."""

import json

import pytest

from data_prep.storage.data_cache import DataCache, prepared
from data_prep.storage.shards import CorruptShardError
from training.data.shard_reader import ShardIndex


@pytest.fixture
def data_url(s3, demo_data, monkeypatch, tmp_path):
    url = f"s3://{s3.bucket}/cache-test/{tmp_path.name}"
    s3.fs().put(str(demo_data), url, recursive=True)
    monkeypatch.setenv("BLOOMLINE_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(DataCache, "_open", {})
    return url


def cached_bytes(root) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.arrow"))


def test_the_cache_holds_its_bound_and_only_the_prepared_bytes(data_url, demo_data, monkeypatch):
    sizes = sorted(p.stat().st_size for p in (demo_data / "shards" / "train").rglob("*.arrow"))
    bound = sum(sizes[-3:])  # room for the three largest shards
    monkeypatch.setenv("BLOOMLINE_DATA_CACHE_GIB", str(bound / 2**30))
    index = ShardIndex(data_url, "train")
    local = index.data_dir
    assert (local / "manifest.json").read_bytes() == (demo_data / "manifest.json").read_bytes()
    assert sorted(p.name for p in (local / "tokenizer").iterdir()) == sorted(
        p.name for p in (demo_data / "tokenizer").iterdir()
    )
    for sid in range(len(index.shards)):  # every shard read in turn: the oldest go
        toks, _ = index.fetch(sid, 0)
        assert len(toks) > 0 and cached_bytes(local / "shards") <= bound
    assert len(list((local / "shards").rglob("*.arrow"))) < len(index.shards)
    for p in (local / "shards").rglob("*.arrow"):
        assert p.read_bytes() == (demo_data / p.relative_to(local)).read_bytes()


def test_a_corrupt_object_is_refused_and_a_new_manifest_empties_the_cache(s3, data_url, demo_data):
    fs = s3.fs()
    m = json.loads((demo_data / "manifest.json").read_text())
    shard = next(s for s in m["shards"] if s["split"] == "train")
    fs.pipe_file(f"{data_url}/{shard['path']}", b"not the shard")
    index = ShardIndex(data_url, "train")
    sid = next(i for i, s in enumerate(index.shards) if s["path"] == shard["path"])
    with pytest.raises(CorruptShardError, match=rf"^shard {data_url}/{shard['path']} is corrupt"):
        index.fetch(sid, 0)
    assert not (index.data_dir / shard["path"]).exists()  # nothing kept of it
    other = next(i for i in range(len(index.shards)) if i != sid)
    index.fetch(other, 0)
    assert cached_bytes(index.data_dir / "shards") > 0
    m["seed"] = m["seed"] + 1  # the folder at the URL prepared again, differently
    fs.pipe_file(f"{data_url}/manifest.json", json.dumps(m).encode())
    DataCache._open.clear()
    assert prepared(data_url) == index.data_dir and cached_bytes(index.data_dir / "shards") == 0


def test_a_swapped_cached_shard_is_hashed_again_and_fetched_again(data_url, demo_data):
    """A cached shard is trusted only while its record matches: one changed in place (same size)
    is hashed again when opened, found wrong, and fetched again, never trained on."""
    import os

    index = ShardIndex(data_url, "train")
    path = index.rows[0].path
    index.fetch(0, 0)
    prepared_bytes = (demo_data / index.shards[0]["path"]).read_bytes()
    assert path.read_bytes() == prepared_bytes
    st = path.stat()
    path.write_bytes(b"POISONED".ljust(st.st_size, b"\0"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    DataCache._open.clear()
    again = ShardIndex(data_url, "train")
    toks, _ = again.fetch(0, 0)
    assert path.read_bytes() == prepared_bytes and len(toks) > 0
