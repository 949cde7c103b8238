"""A folder a job writes has one owner: the job holds a lock on ``FOLDER/.lock`` while it runs.

``bloomline pipeline``, ``prepare``, ``train`` and ``evaluate`` (and the flows behind them, which
``bloomline serve`` also runs) take it on the folder they write. The lock is ``flock`` on that
file, so the kernel releases it when the holder dies however it dies (on NFS, the server when the
client's lease ends); the file names the holder (pid, host, command, job token) for the refusal:

    error: /runs/x is in use by pid 4242 on node-3 (bloomline train, since 2026-12-03T08:01:07+00:00)

Within one job the lock is re-entrant: a flow nested in the pipeline, or the evaluation watcher
writing its results into the run its training job holds, carries the holder's job token
(flows/lifeline.py) and goes ahead. A lock whose holder died (the file still names it, but no one
holds it) is taken over, and the takeover is logged; when the dead holder ran on this host, the
processes of its job that are still alive are ended first (flows/lifeline.py sweep), so nothing of
the old job writes beside the new one. A file that names a job still alive on this host that does
not hold it is a copy (``cp -r`` of a folder that job writes): it is taken, said so, and that job
is left alone. The file is emptied when the lock is released.
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
from flows import lifeline

LOCK_FILE = ".lock"


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


def acquire(folder: str | Path, command: str, say: Callable[[str], None] = print) -> RunLock:
    """Take ``folder``'s lock for this process's job (see the module docstring); raises
    FolderInUse naming the holder when another live job has it. ``say`` hears about a takeover."""
    tok = lifeline.ensure_driver()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        if holder.get("token") == tok:
            return RunLock(path, None)
        raise FolderInUse(
            f"{folder} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
            f"({holder.get('command', '?')}, since {holder.get('since', '?')}); wait for it to end, "
            f"or stop that job first"
        ) from None
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


def _write_holder(fd: int, command: str, tok: str) -> None:
    """Name this process as the lock's holder in its file (what a refusal quotes), synced."""
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "token": tok,
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode())
    os.fsync(fd)


def owns(folder_of: Callable[..., Any], command: str) -> Callable:
    """Decorate a flow function: it runs holding the lock of ``folder_of(**its arguments)``,
    takeovers logged on the flow run's logger. Under the ``bloomline`` command, which took the
    lock first, this is the re-entrant case; a flow run ``bloomline serve`` starts takes it here,
    once its arguments passed flows/served.py's check."""
    import functools
    import inspect
    import typing

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            from prefect import get_run_logger

            from flows import served

            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            served.check(bound.arguments)  # a run bloomline serve started: before anything is touched
            with acquire(folder_of(**bound.arguments), command, say=get_run_logger().warning):
                return fn(*args, **kwargs)

        # the flow's annotations resolved where they were written: Prefect reads them from the
        # wrapper, whose module does not know the flow's own types (flows/params.py InProcess)
        hints = typing.get_type_hints(fn)
        run.__annotations__ = hints
        run.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[q.replace(annotation=hints.get(q.name, q.annotation)) for q in sig.parameters.values()],
            return_annotation=hints.get("return", sig.return_annotation),
        )
        return run

    return wrap
