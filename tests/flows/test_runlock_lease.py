"""The lock of a folder at a URL (flows/runlock.py): a lease object on the loopback S3 server
(tests/support/s3.py), taken with a conditional write, renewed, taken over when left, refused
in one line naming its holder while held."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import lifeline, runlock
from flows.runlock import LOCK_FILE, FolderInUse, acquire

REPO = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from flows import lifeline
from flows.runlock import acquire
lifeline.become_driver()
acquire(sys.argv[1], "test holder")
print("held", flush=True)
time.sleep(300)
"""


def test_a_second_job_on_a_url_in_use_is_refused_and_a_released_lease_is_gone(s3):
    url = f"s3://{s3.bucket}/locks/held"
    env = {k: v for k, v in os.environ.items() if k != lifeline.JOB_ENV}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
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
    monkeypatch.setattr(runlock, "LEASE_SECONDS", 4.0)  # the store's times are whole seconds
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
        time.sleep(3.0)
        assert fs.info(key, refresh=True)["LastModified"] > first  # the heartbeat rewrote it
        assert json.loads(fs.cat_file(key))["token"] == lifeline.ensure_driver()
    finally:
        lease.release()
