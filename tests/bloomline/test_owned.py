"""Caches and locks belong to their user (bloomline/owned.py, flows/run/runlock.py), tried by a second
local user (``nobody``, started with setpriv): a cache folder made first by someone else, a
symbolic link planted for a lock, a read-only ``flock`` on a run folder's lock: each refused or
harmless, none followed."""

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from bloomline.owned import NotOwned, cache_home, open_lock, owned_dir

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
as_root = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None, reason="needs root to act as a second user"
)


@pytest.fixture
def shared_tmp():
    """A folder both users reach, sticky and world-writable as /tmp is."""
    d = Path(tempfile.mkdtemp(prefix="bloomline-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def nobody(*cmd, **kw):
    return subprocess.run([*NOBODY, *cmd], capture_output=True, text=True, timeout=60, **kw)


@as_root
def test_a_cache_folder_another_user_made_first_is_refused(shared_tmp, monkeypatch):
    from bloomline.storage import scratch_dir
    from data_prep.storage.data_cache import cache_root

    assert nobody("mkdir", "-p", str(shared_tmp / "bloomline" / "data")).returncode == 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_tmp))
    monkeypatch.delenv("BLOOMLINE_DATA_CACHE", raising=False)
    monkeypatch.delenv("BLOOMLINE_SCRATCH", raising=False)
    assert cache_home() == shared_tmp / "bloomline"
    for make in (cache_root, scratch_dir):
        with pytest.raises(NotOwned, match=r"owned by uid 65534"):
            make()


def test_a_cache_folder_is_made_private_and_a_shared_or_linked_one_is_refused(tmp_path, monkeypatch):
    from data_prep.storage.data_cache import cache_root

    monkeypatch.setenv("BLOOMLINE_DATA_CACHE", str(tmp_path / "cache"))
    assert stat.S_IMODE(cache_root().stat().st_mode) == 0o700
    (tmp_path / "cache").chmod(0o777)
    with pytest.raises(NotOwned, match=r"writable by others \(mode 777\)"):
        cache_root()
    (tmp_path / "cache").rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotOwned, match=r"cache is a symbolic link"):
        cache_root()


def test_a_lock_file_is_never_followed_nor_truncated(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o600)
    (tmp_path / ".cache.lock").symlink_to(victim)
    with pytest.raises(NotOwned, match=r"\.cache\.lock is a symbolic link"):
        open_lock(tmp_path / ".cache.lock")
    assert victim.read_text() == "precious"
    fd = open_lock(tmp_path / "own.lock")
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "own.lock").stat().st_mode) == 0o600


@as_root
def test_another_user_cannot_enter_the_cache_to_swap_a_shard(shared_tmp, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_tmp))
    data = owned_dir(cache_home() / "data")
    (data / "x.arrow").write_bytes(b"prepared")
    res = nobody("sh", "-c", f"echo POISONED > {data}/x.arrow || echo POISONED > {data}/y.arrow")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert (data / "x.arrow").read_bytes() == b"prepared"


@as_root
def test_a_run_folder_lock_is_private_links_are_refused_and_another_users_hold_is_named(shared_tmp):
    from flows.run import lifeline
    from flows.run.runlock import FolderInUse, acquire

    lifeline.ensure_driver()
    run = shared_tmp / "run"
    run.mkdir()
    run.chmod(0o755)
    # a received run folder whose .lock links to one of the user's files
    victim = shared_tmp / "victim"
    victim.write_text("precious")
    (run / ".lock").symlink_to(victim)
    with pytest.raises(FolderInUse, match=r"cannot be locked: .*\.lock is a symbolic link"):
        acquire(run, "test")
    assert victim.read_text() == "precious"
    (run / ".lock").unlink()
    # the lock it makes is 0600: another user cannot open it, so cannot hold it
    acquire(run, "test").release()
    assert stat.S_IMODE((run / ".lock").stat().st_mode) == 0o600
    res = nobody("flock", "-n", str(run / ".lock"), "true")
    assert res.returncode != 0 and "Permission denied" in res.stderr
    # an older lock file readable by all, held by another user's read-only open: named as such
    (run / ".lock").chmod(0o644)
    holder = subprocess.Popen([*NOBODY, "flock", "-s", str(run / ".lock"), "sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while str(os.stat(run / ".lock").st_ino) not in Path("/proc/locks").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(FolderInUse, match=rf"^{run} is locked by pid \d+ of uid 65534, another user"):
            acquire(run, "test")
    finally:
        holder.kill()
        holder.wait()
