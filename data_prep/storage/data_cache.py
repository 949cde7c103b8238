"""Prepared data at a URL (``s3://bucket/run``), read through a bounded local cache on each node.

``bloomline train --data s3://…`` reads the folder as it reads a local one: :func:`prepared`
gives the local folder every reader opens. Its ``manifest.json`` and ``tokenizer/`` are fetched at
once (the manifest again at every open: when it changed, the cached shards are dropped); a shard
is fetched when :func:`data_prep.storage.shards.read_shard` first opens it (:func:`fetched_shard`),
whole, and kept only once its sha256 is the manifest's, so every byte a rank trains on is the
prepared one. Why whole shards, not ranged reads: a shard is memory-mapped and its rows are
drawn at random; whole files are one request each and then read at local-disk speed
(bench/object_store.py measures both).

The cache is one folder per URL under ``BLOOMLINE_DATA_CACHE`` (default: ``data`` in this user's
cache, bloomline/owned.py: made 0700 and checked to be this user's own before each use), shared
by the ranks of a node: a shard is fetched under a per-shard ``flock`` (one rank downloads, the
others wait and map it). A shard's name is the manifest's, confined to the folder
(bloomline/names.py). A cached shard is trusted only while its record (``NAME.ok``: the sha256
it was hashed to when fetched, its size and mtime) matches the manifest's sha256 and the file's
size and mtime; a shard whose size or mtime changed is hashed again, and fetched again if it is
no longer the manifest's. It holds at most ``BLOOMLINE_DATA_CACHE_GIB`` (default
:data:`DEFAULT_GIB`) of shards: before a fetch, the least recently opened shards are removed
until the new one fits (a rank that still maps a removed shard reads on; the space returns when
it closes it). A bound smaller than the shards one node reads makes them fetched again and again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Iterator

from bloomline.errors import DataError
from bloomline.io import sha256_file, tmp_path, write_bytes_atomic, write_json_atomic
from bloomline.names import checked_name, confined
from bloomline.owned import cache_home, open_lock, owned_dir
from bloomline.storage import errors_named, filesystem, is_url, join, local_path, url_key

MANIFEST = "manifest.json"
DEFAULT_GIB = 100.0
"""The default bound of a node's cache of one data URL's shards."""


def cache_root() -> Path:
    """This user's data cache (checked: bloomline/owned.py)."""
    return owned_dir(os.environ.get("BLOOMLINE_DATA_CACHE") or cache_home() / "data")


def cache_bytes() -> int:
    try:
        gib = float(os.environ.get("BLOOMLINE_DATA_CACHE_GIB") or DEFAULT_GIB)
    except ValueError:
        raise DataError("BLOOMLINE_DATA_CACHE_GIB must be a number of GiB") from None
    return int(gib * (1 << 30))


class DataCache:
    """This node's cache of the prepared folder at ``url`` (one per URL and process: :meth:`of`)."""

    _open: dict[str, "DataCache"] = {}
    _lock = threading.Lock()

    def __init__(self, url: str, local: Path, max_bytes: int):
        self.url, self.local, self.max_bytes = url, local, max_bytes
        self.fs, self.root = filesystem(url)
        self.shards: dict[str, dict[str, Any]] = {}

    @classmethod
    def of(cls, url: str) -> "DataCache":
        url = url.rstrip("/")
        with cls._lock:
            if url not in cls._open:
                c = cls(url, cache_root() / url_key(url), cache_bytes())
                c.refresh()
                cls._open[url] = c
            return cls._open[url]

    def refresh(self) -> None:
        """The store's manifest and tokenizer here; the cached shards dropped if the manifest changed."""
        with errors_named(join(self.url, MANIFEST)):
            try:
                data = self.fs.cat_file(join(self.root, MANIFEST))
            except FileNotFoundError:
                raise DataError(
                    f"{join(self.url, MANIFEST)} not found: is {self.url} the --out folder of a finished 'bloomline prepare'?"
                ) from None
        owned_dir(self.local)
        with _locked(self.local / ".cache.lock"):
            mine = self.local / MANIFEST
            if not mine.exists() or mine.read_bytes() != data:
                shutil.rmtree(self.local / "shards", ignore_errors=True)  # another data set at this URL now
                shutil.rmtree(self.local / "tokenizer", ignore_errors=True)
                with errors_named(join(self.url, "tokenizer")):
                    self.fs.get(join(self.root, "tokenizer") + "/", str(self.local / "tokenizer") + "/", recursive=True)
                write_bytes_atomic(mine, data)
        try:
            shards = json.loads(data)["shards"]
            self.shards = {s["path"]: s for s in shards}
        except (ValueError, KeyError, TypeError):
            self.shards = {}  # load_manifest names what is wrong with it
        for name in self.shards:
            checked_name(name, join(self.url, MANIFEST))

    def shard(self, path: Path, corrupt: type[Exception]) -> Path:
        """The shard at local ``path`` (under :attr:`local`), fetched and checked unless its cached
        copy is the manifest's (module docstring; ``corrupt`` raised, naming its URL, when the
        store's sha256 is not the manifest's)."""
        rel = path.relative_to(self.local).as_posix()
        entry = self.shards.get(rel)
        if entry is None:
            return path  # not a shard of the manifest: read_shard refuses it as it is
        owned_dir(self.local)
        path = confined(self.local, rel, join(self.url, MANIFEST))
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_name(path.name + ".lock")):  # one rank of the node fetches it; the others wait
            if self._cached(path, entry["sha256"]):
                os.utime(_record(path))  # recently opened: the last to be evicted
                return path
            path.unlink(missing_ok=True)
            self._make_room(self._size(rel))
            tmp = tmp_path(path)
            try:
                with errors_named(join(self.url, rel)):
                    self.fs.get_file(join(self.root, rel), str(tmp))
                if sha256_file(tmp) != entry["sha256"]:
                    raise corrupt(f"shard {join(self.url, rel)} is corrupt: its sha256 does not match the manifest's")
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            self._remember(path, entry["sha256"])
        return path

    @staticmethod
    def _cached(path: Path, sha256: str) -> bool:
        """Whether the file at ``path`` is the shard of ``sha256``: by its record while its size and
        mtime are those recorded, else hashed again (and recorded when it still matches)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        try:
            rec = json.loads(_record(path).read_text())
        except (OSError, ValueError):
            rec = {}
        if rec == {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
        if sha256_file(path) != sha256:
            return False
        DataCache._remember(path, sha256)
        return True

    @staticmethod
    def _remember(path: Path, sha256: str) -> None:
        st = os.stat(path)
        write_json_atomic(_record(path), {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})

    def _size(self, rel: str) -> int:
        try:
            return int(self.fs.info(join(self.root, rel))["size"])
        except Exception:
            return 0  # the fetch that follows names what is wrong

    def _make_room(self, need: int) -> None:
        """Remove the least recently opened shards until ``need`` more bytes fit the bound."""
        files = [p for p in (self.local / "shards").rglob("*.arrow") if p.is_file()]
        held = sum(p.stat().st_size for p in files)
        for p in sorted(files, key=_last_opened):
            if held + need <= self.max_bytes:
                break
            held -= p.stat().st_size
            p.unlink(missing_ok=True)
            _record(p).unlink(missing_ok=True)


def _record(shard: Path) -> Path:
    """What a cached shard was hashed to when fetched (``NAME.ok``); its mtime: when last opened."""
    return shard.with_name(shard.name + ".ok")


def _last_opened(shard: Path) -> int:
    try:
        return _record(shard).stat().st_mtime_ns
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """``flock`` held on the lock file ``path`` (bloomline/owned.py: never through a link, 0600)."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def prepared(where: str | Path) -> Path:
    """The local folder to read the prepared data at ``where`` from: itself, or for a URL its
    copy in this node's cache (see the module docstring)."""
    if not is_url(str(where)):
        return local_path(where)
    return DataCache.of(str(where)).local


def fetched_shard(path: Path, corrupt: type[Exception]) -> Path:
    """``path`` fetched into its cache when it lies in one open in this process, else itself."""
    for c in list(DataCache._open.values()):
        if path.is_relative_to(c.local):
            return c.shard(path, corrupt)
    return path


def source_of(folder: Path) -> str:
    """What ``folder`` is a copy of: the URL of an open cache holding it, else the folder itself."""
    for c in list(DataCache._open.values()):
        if folder == c.local:
            return c.url
    return str(folder)
