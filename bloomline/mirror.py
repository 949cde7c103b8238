"""A local copy of a folder on an object store, for code that reads and writes files by path.

Every stage writes its files by path, each atomically and each marker after what it marks
(bloomline/io.py). With the folder at a URL, each process works in a local copy of it (its
*mirror*: a Dask worker's own local directory, else this machine's temporary folder; nothing
shared between machines but the store):

* reads go through :meth:`Mirror.fetch` / :meth:`Mirror.fetch_tree`: the store's copy of a file,
  downloaded once per process. Only the store says what exists: a local file this process has
  not fetched or written itself is checked against it, and removed where the store lacks it (a
  killed process may have left a file it never uploaded);
* writes happen inside :meth:`Mirror.task`: the files published there (bloomline/io.py
  ``publish``) are uploaded when it ends, one after the other in the order they were published.
  An object store has no rename, but one upload is atomic (the object appears whole or not at
  all), so the store sees the files appear in the order a local disk would: a kill at any moment
  leaves a prefix of them, markers never before what they mark, and the rerun completes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from bloomline.io import journal, open_journal, tmp_path
from bloomline.names import confined
from bloomline.storage import errors_named, filesystem, join, scratch_dir, url_key


class Mirror:
    """The local copy of the folder at ``url`` in this process (one per URL: :meth:`of`)."""

    _open: dict[str, "Mirror"] = {}
    _lock = threading.Lock()

    def __init__(self, url: str, local: Path):
        self.url = url.rstrip("/")
        self.local = local
        self.fs, self.root = filesystem(self.url)
        self._known: set[str] = set()  # relative names whose local copy is the store's (fetched or uploaded here)

    @classmethod
    def of(cls, url: str) -> "Mirror":
        """This process's mirror of ``url``, under :func:`scratch_dir`."""
        url = url.rstrip("/")
        with cls._lock:
            if url not in cls._open:
                m = cls(url, scratch_dir() / "bloomline-mirrors" / url_key(url))
                m.check_reachable()
                cls._open[url] = m
            return cls._open[url]

    def check_reachable(self) -> None:
        """A store with buckets: its bucket is there and these credentials may list it, else one
        line naming it (a folder not made yet is fine: a bucket's objects need no folders)."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol in ("s3", "s3a", "gs", "gcs", "abfs", "az"):
            bucket = self.root.split("/")[0]
            with errors_named(f"{protocol}://{bucket}"):
                self.fs.ls(bucket, detail=False, refresh=True)

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.local).as_posix()

    def remote(self, rel: str) -> str:
        return join(self.root, rel)

    def _trusted(self, path: Path, rel: str) -> bool:
        from bloomline.io import being_published

        return rel in self._known or being_published(path)

    def fetch(self, path: Path) -> Path:
        """``path`` (under :attr:`local`) as the store has it: downloaded once, or absent locally
        when the store has no such object (yet). Returns ``path``."""
        path = Path(path)
        rel = self.rel(path)
        if self._trusted(path, rel):
            return path
        with errors_named(join(self.url, rel)):
            try:
                self._download(rel, path)
            except FileNotFoundError:
                pass
        return path

    def _download(self, rel: str, path: Path) -> None:
        """The store's object ``rel`` to ``path``; FileNotFoundError (the local leftover removed)
        when there is none."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # per thread: a Dask worker's threads may fetch the same file at once
        tmp = tmp_path(path.with_name(f"{path.name}.{threading.get_ident()}"))
        try:
            self.fs.get_file(self.remote(rel), str(tmp))
            os.replace(tmp, path)
        except FileNotFoundError:
            path.unlink(missing_ok=True)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        self._known.add(rel)

    def fetch_tree(self, folder: Path) -> Path:
        """Every file under ``folder`` as the store has it (local files it lacks removed). Returns ``folder``."""
        folder = Path(folder)
        prefix = self.rel(folder)
        with errors_named(join(self.url, prefix)):
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(self.remote(prefix))
            except FileNotFoundError:
                found = []
            names = {f[len(self.root.rstrip("/")) + 1 :] for f in found}
            for rel in sorted(names):  # the store's names: each confined to this copy (bloomline/names.py)
                path = confined(self.local, rel, join(self.url, prefix))
                if not self._trusted(path, rel):
                    self._download(rel, path)
        if folder.is_dir():
            for p in folder.rglob("*"):
                rel = self.rel(p)
                if p.is_file() and rel not in names and not self._trusted(p, rel):
                    p.unlink()
        return folder

    @contextlib.contextmanager
    def task(self) -> Iterator[None]:
        """Upload what this thread publishes under :attr:`local` in the block, in the order
        published, once the block ends; what was published by a block that failed is forgotten."""
        with journal() as published:
            try:
                yield
            except BaseException:
                for p in published:
                    self._forget(p)
                published.clear()
                raise
            self.flush()

    def flush(self) -> None:
        """Upload what this thread has published under :attr:`local` in its open :meth:`task` so
        far, in order (before work that reads it leaves this process: a Dask task)."""
        published = open_journal()
        if published is None:
            return
        mine = [p for p in published if p.is_relative_to(self.local)]
        self.upload(mine)
        for p in mine:  # uploaded: not again by an enclosing task of the same thread
            del published[p]

    def upload(self, paths: list[Path]) -> None:
        for i, p in enumerate(paths):
            rel = self.rel(p)
            try:
                with errors_named(join(self.url, rel)):
                    self.fs.put_file(str(p), self.remote(rel))
            except BaseException:
                for q in paths[i:]:
                    self._forget(q)
                raise
            self._known.add(rel)

    def _forget(self, p: Path) -> None:
        if p.is_relative_to(self.local):
            self._known.discard(self.rel(p))
            p.unlink(missing_ok=True)

    def remove(self, folder: Path) -> None:
        """Delete ``folder`` (under :attr:`local`) here and on the store."""
        rel = self.rel(folder)
        with errors_named(join(self.url, rel)):
            try:
                self.fs.rm(self.remote(rel), recursive=True)
            except FileNotFoundError:
                pass
        self._known = {k for k in self._known if not (k == rel or k.startswith(rel + "/"))}
        shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Drop this process's copy (the store keeps everything)."""
        with Mirror._lock:
            Mirror._open.pop(self.url, None)
        shutil.rmtree(self.local, ignore_errors=True)


def drop(url: str) -> None:
    """Remove this process's copy of the folder at ``url``, if it has one (a finished run's, on a
    long-lived Dask worker: the store keeps everything)."""
    m = Mirror._open.get(url.rstrip("/"))
    if m is not None:
        m.close()


def mirror_of(path: Path) -> Mirror | None:
    """The mirror open in this process that ``path`` lies in, if any."""
    for m in list(Mirror._open.values()):
        if Path(path).is_relative_to(m.local):
            return m
    return None


def fetched(path: Path) -> Path:
    """``path`` as the store has it where it lies in a mirror open in this process (see
    :meth:`Mirror.fetch`), else ``path`` itself: for readers that take paths, not a folder."""
    m = mirror_of(path)
    return m.fetch(path) if m else path


class MirroredTask:
    """``fn(item)`` run inside the mirror of ``url`` (:meth:`Mirror.task`) in whatever process runs
    it: what it publishes reaches the store before its result returns. Picklable (Dask ships it)."""

    def __init__(self, fn: Callable[[Any], Any], url: str):
        self.fn, self.url = fn, url
        self.__name__ = getattr(getattr(fn, "func", fn), "__name__", "task")

    def __call__(self, item: Any) -> Any:
        with Mirror.of(self.url).task():
            return self.fn(item)
