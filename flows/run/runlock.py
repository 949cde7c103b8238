"""A folder a job writes has one owner: the job holds a lock on ``FOLDER/.lock`` while it runs.

``bloomline pipeline``, ``prepare``, ``train`` and ``evaluate`` (and the flows behind them, which
``bloomline serve`` also runs) take it on the folder they write. The lock is ``flock`` on that
file, so the kernel releases it when the holder dies however it dies (on NFS, the server when the
client's lease ends); the file names the holder (pid, host, command, job token) for the refusal:

    error: /runs/x is in use by pid 4242 on node-3 (bloomline train, since 2026-12-03T08:01:07+00:00)

Within one job the lock is re-entrant: a flow nested in the pipeline, or the evaluation watcher
writing its results into the run its training job holds, carries the holder's job token
(flows/run/lifeline.py) and goes ahead. A lock whose holder died (the file still names it, but no one
holds it) is taken over, and the takeover is logged; when the dead holder ran on this host, the
processes of its job that are still alive are ended first (flows/run/lifeline.py sweep), so nothing of
the old job writes beside the new one. A file that names a job still alive on this host that does
not hold it is a copy (``cp -r`` of a folder that job writes): it is taken, said so, and that job
is left alone. The file is emptied when the lock is released.

A folder at a URL (``s3://bucket/run``) has no ``flock``: its lock is a *lease*, the object
``URL/.lock`` naming the holder as the file does, created, renewed, taken over and deleted with
conditional writes (bloomline/lease.py), so two jobs never both hold it; a job whose lease was
taken over (it stalled past the lease) is ended in one line.

The lock file is this user's (bloomline/owned.py ``open_lock``): never opened through a symbolic
link, mode 0600, so no other user can open it to hold it; a lock held by another user's process
is named as such (from ``/proc/locks``).
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional

from bloomline.errors import BloomlineError
from bloomline.lease import LOCK_FILE, Lease, LeaseHeld, take
from bloomline.storage import is_url
from flows.run import lifeline


class FolderInUse(BloomlineError):
    """Another job holds the folder's lock."""


def _holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        h = json.loads(raw) if raw.strip() else {}
        return h if isinstance(h, dict) else {}
    except ValueError:
        return {}


class RunLock:
    """A held lock (``release`` it, or use it as a context manager); ``nested`` when this job
    already held it (releasing a nested lock does nothing)."""

    def __init__(self, path: Path, fd: Optional[int]):
        self.path, self._fd = path, fd

    @property
    def nested(self) -> bool:
        return self._fd is None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def acquire(folder: str | Path, command: str, say: Callable[[str], None] = print) -> "RunLock | Lease":
    """Take ``folder``'s lock for this process's job (see the module docstring); raises
    FolderInUse naming the holder when another live job has it. ``say`` hears about a takeover."""
    tok = lifeline.ensure_driver()
    if is_url(str(folder)):
        return _lease(str(folder), command, tok, say)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        other = _other_users_holder(fd)
        os.close(fd)
        if other:
            raise FolderInUse(f"{folder} is locked by {other}: wait for it to end, or ask its owner") from None
        if holder.get("token") == tok:
            return RunLock(path, None)
        raise _in_use(str(folder), holder) from None
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # a filesystem without locks
            say(
                f"warning: {path} cannot be locked on this filesystem ({e.strerror}); a second job on "
                f"{folder} would not be refused"
            )
            return RunLock(path, None)
        raise
    previous = _holder(fd)
    if previous.get("token") not in (None, tok):  # its holder died without releasing it
        _take_over(folder, previous, say)
    _write_holder(fd, command, tok)
    return RunLock(path, fd)


def _open_lock(path: Path) -> int:
    """The lock file, opened for ``flock`` (bloomline/owned.py: never through a symbolic link, a
    regular file of this user's; mode 0600, so no other user can open it to hold it); a file an
    earlier bloomline made readable by all is made 0600."""
    from bloomline.owned import NotOwned, open_lock

    try:
        fd = open_lock(path)
    except NotOwned as e:
        raise FolderInUse(f"{path.parent} cannot be locked: {e}") from None
    except PermissionError:
        raise FolderInUse(f"{path.parent} cannot be locked: {path} is not this user's to open") from None
    os.fchmod(fd, 0o600)
    return fd


def _other_users_holder(fd: int) -> str | None:
    """Who holds the ``flock`` on ``fd``'s file, when it is a process of another user ("pid N of uid
    M"), from ``/proc/locks``; None when it is this user's (or cannot be told)."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (a blocked waiter's line has "->")
        if len(f) >= 6 and f[1] == "FLOCK" and "->" not in f and f[5] == dev:
            try:
                uid = os.stat(f"/proc/{f[4]}").st_uid
            except OSError:
                return None
            return f"pid {f[4]} of uid {uid}, another user" if uid != os.getuid() else None
    return None


def _take_over(folder: Path, previous: dict[str, Any], say: Callable[[str], None]) -> None:
    """The lock just taken was left by a holder that died without releasing it (``previous``, the
    file's record of it): on this host, end the processes of its job still alive, unless that job
    still runs (then this folder is a copy of one it holds, and it is left alone); say which."""
    host = socket.gethostname()
    where = f"pid {previous.get('pid', '?')} on {previous.get('host', '?')} ({previous.get('command', '?')})"
    if previous.get("host") == host and previous.get("token") and lifeline.is_alive(previous["token"]):
        # nobody holds this file, yet the job it names lives: it holds the lock of another folder,
        # and this one is a copy of it (cp -r of a run in training). That job is not ours to end.
        say(
            f"{folder} is a copy of a folder in use by {where}, which still runs: this job takes the copy "
            f"and leaves that one alone"
        )
    elif previous.get("host") == host and previous.get("token"):
        ended = lifeline.sweep(previous["token"])
        say(
            f"took over {folder} from {where}, which is gone"
            + (f"; ended {len(ended)} of its processes still running" if ended else "")
        )
    else:
        say(
            f"took over {folder} from {where}, which is gone; processes it left on "
            f"{previous.get('host', '?')} are that host's to end"
        )


def _me(command: str, tok: str) -> dict[str, Any]:
    """This process as a lock's holder (what a refusal quotes)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "token": tok,
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _in_use(folder: str, holder: dict[str, Any]) -> FolderInUse:
    return FolderInUse(
        f"{folder} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
        f"({holder.get('command', '?')}, since {holder.get('since', '?')}); wait for it to end, "
        f"or stop that job first"
    )


def _lease(url: str, command: str, tok: str, say: Callable[[str], None]) -> Lease:
    """Take the lease on the folder at ``url`` (bloomline/lease.py), or raise FolderInUse naming its
    holder; a lease this job loses later ends the job in one line."""
    from flows.run import interrupt

    try:
        return take(url, _me(command, tok), say, on_lost=lambda line: interrupt.end_job(f"error: {line}", 2))
    except LeaseHeld as e:
        raise _in_use(url, e.holder) from None


def _write_holder(fd: int, command: str, tok: str) -> None:
    """Name this process as the lock's holder in its file (what a refusal quotes), synced."""
    me = _me(command, tok)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode())
    os.fsync(fd)


def owns(folder_of: Callable[..., Any], command: str) -> Callable:
    """Decorate a flow function: it runs holding the lock of ``folder_of(**its arguments)``,
    takeovers logged on the flow run's logger. Under the ``bloomline`` command, which took the
    lock first, this is the re-entrant case; a flow run ``bloomline serve`` starts takes it here,
    once its arguments passed flows/run/served.py's check."""
    import functools
    import inspect
    import typing

    from flows.run import served

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            from prefect import get_run_logger

            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            served.check(bound.arguments, extras)  # a run bloomline serve started: before anything is touched
            with acquire(folder_of(**bound.arguments), command, say=get_run_logger().warning):
                return fn(*args, **kwargs)

        # the flow's annotations resolved where they were written: Prefect reads them from the
        # wrapper, whose module does not know the flow's own types (flows/run/params.py InProcess)
        hints = typing.get_type_hints(fn)
        extras = served.parameters_of(fn)  # which parameters are locations, which recipes
        run.__annotations__ = hints
        run.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[q.replace(annotation=hints.get(q.name, q.annotation)) for q in sig.parameters.values()],
            return_annotation=hints.get("return", sig.return_annotation),
        )
        return run

    return wrap
