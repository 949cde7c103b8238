"""An exclusive lease on a folder at a URL: the object ``URL/.lock`` naming its holder.

An object store has no ``flock``. A job holds a folder at a URL (a prepare's ``--out``, a run's
``checkpoint.mirror``) by writing this object and renewing it every :data:`LEASE_SECONDS` / 3;
one not renewed for :data:`LEASE_SECONDS` is its dead holder's and may be taken over. Every
change is conditional on what the job last saw, so two jobs never both hold it:

* taking it: a conditional create (S3's ``If-None-Match: *``): of two jobs starting at once, one
  write succeeds;
* taking over a stale lease, and each renewal: a conditional replace on the version read
  (S3's ``If-Match: ETAG``): of two jobs taking over at once, one write succeeds, and a renewal
  by a job whose lease was taken fails; that job then stops (``on_lost``) in one line;
* releasing it: a conditional delete on the job's own version.

After each write the lease is read back and must name this job. The lease's age is the store's
own clock (``LastModified``, ``mtime``, ``updated`` or ``last_modified``, whichever it gives),
else the ``renewed`` time the holder wrote in it.

S3 and S3-compatible stores (s3fs) make these conditional writes. Any other store is written
unconditionally and read back after :data:`SETTLE_SECONDS`: two writers at once are refused when
either reads back the other's record, which a store with read-after-write consistency
guarantees for the later writer (docs/object-storage.md says which stores are which).
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import threading
import time
from typing import Any, Callable, Optional

from bloomline.errors import BloomlineError
from bloomline.storage import errors_named, filesystem, join

LEASE_SECONDS = 90.0
"""A lease not renewed for this long is its dead holder's, and is taken over."""
SETTLE_SECONDS = 1.0
"""On a store without conditional writes: how long a writer waits before reading its lease back."""
LOCK_FILE = ".lock"


class LeaseHeld(BloomlineError):
    """Another live job holds the lease; ``holder`` is its record."""

    def __init__(self, url: str, holder: dict[str, Any], why: str = ""):
        self.url, self.holder = url, holder
        super().__init__(f"{url} is held by {describe(holder)}{why}")


class Conflict(Exception):
    """A conditional write found another version than the one it was made on."""


def describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} ({holder.get('command', '?')})"


def modified(info: dict[str, Any]) -> Optional[float]:
    """When the store last wrote the object (seconds since the epoch), from whichever field it gives."""
    for k in ("LastModified", "mtime", "updated", "last_modified"):
        v = info.get(k)
        if isinstance(v, dt.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).timestamp()
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _tag(info: dict[str, Any]) -> Optional[str]:
    return info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")


class _Store:
    """Conditional writes of one small object on ``fs`` (module docstring)."""

    def __init__(self, fs: Any):
        self.fs = fs
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.conditional = protocol in ("s3", "s3a")

    def read(self, key: str) -> tuple[dict[str, Any], Optional[str], Optional[float]]:
        """The record, its version tag and its age's start; FileNotFoundError when there is none."""
        info = self.fs.info(key, refresh=True) if "refresh" in _params(self.fs.info) else self.fs.info(key)
        raw = self.fs.cat_file(key)
        try:
            rec = json.loads(raw)
            rec = rec if isinstance(rec, dict) else {}
        except ValueError:
            rec = {}
        start = modified(info)
        if start is None and isinstance(rec.get("renewed"), (int, float)):
            start = float(rec["renewed"])
        return rec, _tag(info), start

    def _s3(self, method: str, key: str, **kw: Any) -> dict[str, Any]:
        bucket, path, _ = self.fs.split_path(key)
        try:
            return self.fs.call_s3(method, Bucket=bucket, Key=path, **kw)
        except FileExistsError:
            raise
        except FileNotFoundError:
            raise Conflict() from None  # If-Match on an object gone meanwhile
        except OSError as e:
            if e.errno == errno.EINVAL or any(w in str(e) for w in ("Precondition", "Conflict", "412", "409")):
                raise Conflict() from None
            raise

    def create(self, key: str, data: bytes) -> Optional[str]:
        """Write ``key`` if it does not exist (FileExistsError otherwise); the new version's tag."""
        if self.conditional:
            return self._s3("put_object", key, Body=data, IfNoneMatch="*").get("ETag")
        if self.fs.exists(key):
            raise FileExistsError(key)
        self.fs.pipe_file(key, data)
        return None

    def replace(self, key: str, data: bytes, tag: Optional[str]) -> Optional[str]:
        """Write ``key`` if its version is still ``tag`` (Conflict otherwise); the new version's tag."""
        if self.conditional:
            return self._s3("put_object", key, Body=data, IfMatch=tag).get("ETag")
        if _tag(self.fs.info(key)) != tag:
            raise Conflict()
        self.fs.pipe_file(key, data)
        return None

    def delete(self, key: str, tag: Optional[str]) -> None:
        """Remove ``key`` if its version is still ``tag`` (Conflict otherwise)."""
        if self.conditional:
            self._s3("delete_object", key, IfMatch=tag)
            return
        if _tag(self.fs.info(key)) != tag:
            raise Conflict()
        self.fs.rm_file(key)


def _params(fn: Callable) -> tuple[str, ...]:
    import inspect

    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


class Lease:
    """A held lease on ``url``, renewed by a daemon thread until :meth:`release`; ``key`` None for
    the re-entrant case (this job holds it already). ``on_lost(line)`` is called, once, from the
    renewing thread when another job has taken it (it should stop this job)."""

    def __init__(
        self,
        url: str,
        store: Optional[_Store],
        key: Optional[str],
        holder: dict[str, Any],
        tag: Optional[str],
        on_lost: Callable[[str], None],
    ):
        self.url, self.store, self.key, self.holder, self.tag = url, store, key, holder, tag
        self.on_lost = on_lost
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        if key is not None:
            threading.Thread(target=self._beat, name="bloomline-lease", daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                self.tag = _write(self.store, self.key, self.holder, self.tag)
            except (Conflict, LeaseHeld):
                try:
                    other = describe(self.store.read(self.key)[0])
                except Exception:  # noqa: BLE001 - named without it
                    other = "another job"
                if self._stop.is_set():
                    return
                self.lost = (
                    f"{self.url}: this job's lease was taken over by {other} (this job stalled past "
                    f"{LEASE_SECONDS:.0f} s without renewing it); stopping, as only one job may write there"
                )
                self.on_lost(self.lost)
                return
            except Exception:  # noqa: BLE001 - the store unreachable: the next beat tries again
                continue

    def release(self) -> None:
        self._stop.set()
        if self.key is None:
            return
        try:
            if self.lost is None:
                self.store.delete(self.key, self.tag)
        except Exception:  # noqa: BLE001 - gone already, taken, or the store unreachable: it expires
            pass
        self.key = None

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _write(store: _Store, key: str, holder: dict[str, Any], tag: Optional[str], create: bool = False) -> Optional[str]:
    """Write this job's record (created, or replacing version ``tag``), then read it back: it must
    name this job (LeaseHeld otherwise). The version's tag."""
    data = json.dumps({**holder, "renewed": time.time()}).encode()
    new = store.create(key, data) if create else store.replace(key, data, tag)
    if not store.conditional:
        time.sleep(SETTLE_SECONDS)
    rec, seen, _ = store.read(key)
    if rec.get("token") != holder["token"]:
        raise LeaseHeld(key, rec, ": it wrote its lease at the same moment")
    return new or seen


def take(
    url: str,
    holder: dict[str, Any],
    say: Callable[[str], None],
    on_lost: Callable[[str], None],
) -> Lease:
    """The lease on the folder at ``url`` for the job of ``holder`` (a record with its ``token``,
    ``pid``, ``host``, ``command``); LeaseHeld naming the live holder otherwise. ``say`` hears
    about a takeover; ``on_lost`` is the held lease's (see :class:`Lease`)."""
    fs, root = filesystem(url)
    store, key = _Store(fs), join(root, LOCK_FILE)
    with errors_named(join(url, LOCK_FILE)):
        for _ in range(3):
            try:
                return Lease(url, store, key, holder, _write(store, key, holder, None, create=True), on_lost)
            except FileExistsError:
                pass
            try:
                current, tag, since = store.read(key)
            except FileNotFoundError:
                continue  # released in between: try again
            if current.get("token") == holder["token"]:
                return Lease(url, None, None, current, None, on_lost)
            age = time.time() - since if since is not None else 0.0
            if age < LEASE_SECONDS:
                raise LeaseHeld(url, current)
            try:
                new = _write(store, key, holder, tag)
            except Conflict:
                raise LeaseHeld(url, store.read(key)[0], ", which took it over first") from None
            say(f"took over {url} from {describe(current)}, whose lease was not renewed for {age:.0f} s")
            return Lease(url, store, key, holder, new, on_lost)
    raise LeaseHeld(url, {})
