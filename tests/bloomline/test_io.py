"""Atomic writes leave only bloomline's own temporary names, and only those are swept."""

import os

from bloomline.io import TMP_MARK, remove_stale_tmp, write_bytes_atomic
from bloomline.io import tmp_path as temp_name  # the fixture is tmp_path


def test_only_bloomlines_own_stale_temporaries_are_removed_and_only_where_it_writes(tmp_path):
    ours = [tmp_path / f"manifest.json{TMP_MARK}4242", tmp_path / "shards" / "en" / f"x.arrow{TMP_MARK}17"]
    users = [
        tmp_path / "notes.tmp-1",  # a user's own temporary-looking file
        tmp_path / f"notes{TMP_MARK}draft",  # the mark, but not followed by a pid
        tmp_path / "photos" / f"a.jpg{TMP_MARK}3",  # bloomline's name, in a folder it does not write
    ]
    for p in ours + users:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    assert remove_stale_tmp(tmp_path, ("shards",)) == 2
    assert not any(p.exists() for p in ours) and all(p.exists() for p in users)


def test_atomic_writes_use_the_mark_and_leave_nothing_behind(tmp_path):
    target = tmp_path / "a" / "f.json"
    assert temp_name(target) == tmp_path / "a" / f"f.json{TMP_MARK}{os.getpid()}"
    write_bytes_atomic(target, b"{}")
    assert target.read_bytes() == b"{}" and [p.name for p in target.parent.iterdir()] == ["f.json"]
