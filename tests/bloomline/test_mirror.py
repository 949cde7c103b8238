"""A process's copy of a folder at a URL (bloomline/mirror.py), on the loopback S3 server: files
reach the store in the order published, a failed task's files never do, and only the store says
what exists."""

import pytest

from bloomline.io import write_bytes_atomic
from bloomline.mirror import Mirror


@pytest.fixture
def mirror(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("BLOOMLINE_SCRATCH", str(tmp_path / "scratch"))
    m = Mirror.of(f"s3://{s3.bucket}/mirror-test/{tmp_path.name}")
    yield m
    m.close()


def test_files_reach_the_store_in_the_order_published(s3, mirror, monkeypatch):
    sent = []
    put = mirror.fs.put_file
    monkeypatch.setattr(
        mirror.fs, "put_file", lambda src, dst, **kw: (sent.append(dst.rsplit("/", 1)[1]), put(src, dst, **kw))
    )
    with mirror.task():
        for name in ("b.arrow", "a.arrow", "c.json"):  # the marker last, whatever the names' order
            write_bytes_atomic(mirror.local / "x" / name, name.encode(), durable=False)
    assert sent == ["b.arrow", "a.arrow", "c.json"]
    assert s3.fs().cat_file(f"{mirror.url}/x/c.json") == b"c.json"


def test_a_failed_task_uploads_nothing_and_only_the_store_says_what_exists(s3, mirror):
    with pytest.raises(RuntimeError), mirror.task():
        write_bytes_atomic(mirror.local / "data.arrow", b"half", durable=False)
        raise RuntimeError("killed")
    assert not (mirror.local / "data.arrow").exists() and not s3.fs().exists(f"{mirror.url}/data.arrow")
    # a file a killed process left in the copy, never uploaded: gone at its first read
    leftover = mirror.local / "marker.json"
    leftover.write_text("{}")
    assert not mirror.fetch(leftover).exists()
    # what the store has is fetched, once
    s3.fs().pipe_file(f"{mirror.url}/remote.json", b"[1]")
    assert mirror.fetch(mirror.local / "remote.json").read_bytes() == b"[1]"
