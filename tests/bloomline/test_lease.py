"""The lock of a folder at a URL (bloomline/lease.py, flows/run/runlock.py): a lease object on the
loopback S3 server (tests/support/s3.py), taken with a conditional write, renewed, taken over when
left, refused in one line naming its holder while held; two jobs taking over one stale lease at
once: exactly one holds it; a job whose lease was taken stops in one line."""

import json
import time
from pathlib import Path

import pytest

from bloomline import lease as lease_mod
from bloomline.lease import LeaseHeld, modified, take
from flows.run import lifeline
from flows.run.runlock import LOCK_FILE, FolderInUse, acquire
from tests.support.holder import start_holder

REPO = Path(__file__).resolve().parents[2]


def test_a_second_job_on_a_url_in_use_is_refused_and_a_released_lease_is_gone(s3):
    url = f"s3://{s3.bucket}/locks/held"
    holder = start_holder(url)
    try:
        lease = json.loads(s3.fs().cat_file(f"{url}/{LOCK_FILE}"))
        assert lease["pid"] == holder.pid and lease["command"] == "test holder"
        with pytest.raises(FolderInUse, match=rf"^{url} is in use by pid {holder.pid} on .* \(test holder, since "):
            acquire(url, "second")
    finally:
        holder.kill()
        holder.wait()
    mine = acquire(f"s3://{s3.bucket}/locks/free", "test")
    assert acquire(f"s3://{s3.bucket}/locks/free", "nested").key is None  # re-entrant within the job
    mine.release()
    assert not s3.fs().exists(f"s3://{s3.bucket}/locks/free/{LOCK_FILE}")


def test_a_lease_is_renewed_while_held_and_taken_over_once_left(s3, monkeypatch):
    monkeypatch.setattr(lease_mod, "LEASE_SECONDS", 4.0)  # the store's times are whole seconds
    fs, url = s3.fs(), f"s3://{s3.bucket}/locks/left"
    key = f"{url}/{LOCK_FILE}"
    fs.pipe_file(key, json.dumps({"pid": 1, "host": "node-9", "command": "gone", "token": "t-dead"}).encode())
    with pytest.raises(FolderInUse, match="in use by pid 1 on node-9"):
        acquire(url, "test")
    time.sleep(4.2)
    said = []
    lease = acquire(url, "test", say=said.append)
    try:
        assert len(said) == 1 and said[0].startswith(
            f"took over {url} from pid 1 on node-9 (gone), whose lease was not"
        )
        first = fs.info(key, refresh=True)["LastModified"]
        # the heartbeat rewrites it every 4/3 s; the store's times are whole seconds (a busy machine
        # may delay a beat: up to 15 s)
        deadline = time.monotonic() + 15
        while fs.info(key, refresh=True)["LastModified"] <= first and time.monotonic() < deadline:
            time.sleep(0.5)
        assert fs.info(key, refresh=True)["LastModified"] > first  # the heartbeat rewrote it
        assert json.loads(fs.cat_file(key))["token"] == lifeline.ensure_driver()
    finally:
        lease.release()


def stale(fs, key):
    fs.pipe_file(key, json.dumps({"pid": 1, "host": "node-9", "command": "gone", "token": "t-dead"}).encode())


def test_two_jobs_taking_over_one_stale_lease_at_once_one_holds_it_and_the_other_is_refused(s3, monkeypatch):
    import threading

    monkeypatch.setattr(lease_mod, "LEASE_SECONDS", 0.0)  # any lease is stale: both try to take it over
    fs, url = s3.fs(), f"s3://{s3.bucket}/locks/race"
    stale(fs, f"{url}/{LOCK_FILE}")
    both_read = threading.Barrier(2, timeout=30)
    real_read = lease_mod._Store.read
    first = {"t-a": True, "t-b": True}

    a_done = threading.Event()

    def read(self, key):  # the real read; both see the stale lease, then a goes on to the end, then b
        out = real_read(self, key)
        tok = threading.current_thread().name
        if first.get(tok):
            first[tok] = False
            both_read.wait()
            if tok == "t-b":
                a_done.wait(30)
        return out

    monkeypatch.setattr(lease_mod._Store, "read", read)
    got = {}

    def job(tok):
        try:
            got[tok] = take(url, {"pid": 7, "host": "h", "command": tok, "token": tok}, print, lambda line: None)
        except LeaseHeld as e:
            got[tok] = e
        finally:
            if tok == "t-a":
                a_done.set()

    threads = [threading.Thread(target=job, args=(t,), name=t) for t in ("t-a", "t-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    held = [t for t, v in got.items() if not isinstance(v, LeaseHeld)]
    refused = [v for v in got.values() if isinstance(v, LeaseHeld)]
    assert held == ["t-a"] and len(refused) == 1, got
    assert str(refused[0]) == f"{url} is held by pid 7 on h (t-a), which took it over first"
    assert json.loads(fs.cat_file(f"{url}/{LOCK_FILE}"))["token"] == held[0]
    got[held[0]].release()


def test_a_job_whose_lease_was_taken_over_stops_in_one_line(s3):
    url = f"s3://{s3.bucket}/locks/taken"
    holder = start_holder(url, lease_seconds=1.5)
    try:
        stale(s3.fs(), f"{url}/{LOCK_FILE}")  # another job's record now: as after a takeover
        _, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert holder.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {url}: this job's lease was taken over by pid 1 on node-9 (gone)")


def test_a_leases_age_comes_from_whatever_time_the_store_gives():
    import datetime as dt

    t = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
    for info in ({"LastModified": t}, {"mtime": t}, {"updated": "2026-12-06T12:00:00.000Z"}, {"last_modified": t}):
        assert modified(info) == t.timestamp(), info
    assert modified({"mtime": t.timestamp()}) == t.timestamp() and modified({}) is None


def test_a_store_without_conditional_writes_refuses_a_second_writer_by_reading_back(monkeypatch):
    import fsspec

    monkeypatch.setattr(lease_mod, "SETTLE_SECONDS", 0.0)
    url = "memory://bloomline-lease-test/run"
    fsspec.filesystem("memory").rm("/bloomline-lease-test", recursive=True) if fsspec.filesystem("memory").exists(
        "/bloomline-lease-test"
    ) else None
    mine = take(url, {"pid": 1, "host": "h", "command": "a", "token": "t-1"}, print, lambda line: None)
    with pytest.raises(LeaseHeld, match=r"held by pid 1 on h \(a\)$"):
        take(url, {"pid": 2, "host": "h", "command": "b", "token": "t-2"}, print, lambda line: None)
    mine.release()
    assert not fsspec.filesystem("memory").exists("/bloomline-lease-test/run/.lock")
