"""Folders and lock files that belong to this user, checked before each use.

A cache another user can write is a way into this user's runs: a folder made first under a
predictable name in ``/tmp`` lets its maker swap a cached shard, and a lock file opened with
``open(path, "w")`` truncates whatever file a planted symlink points to. So every cache and
scratch folder bloomline keeps lives under :func:`cache_home` (``$XDG_CACHE_HOME/bloomline``,
else ``~/.cache/bloomline``, as the XDG base-directory spec says) or a ``BLOOMLINE_*`` override,
and :func:`owned_dir` checks it with ``lstat`` each time it is used: ours, a directory, not a
symbolic link, not writable by group or others. A lock file is opened by :func:`open_lock` with
``O_NOFOLLOW``, never truncated, mode 0600, and checked with ``fstat``: a regular file of ours.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from bloomline.errors import BloomlineError


class NotOwned(BloomlineError):
    """A cache folder or lock file is not this user's own (another user's, a link, shared)."""


def cache_home() -> Path:
    """``$XDG_CACHE_HOME/bloomline``, else ``~/.cache/bloomline``: where bloomline's caches live."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".cache") / "bloomline"


def _why_not(st: os.stat_result, kind: str) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if kind == "dir" and not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
        )
    return None


_ADVICE = "bloomline keeps its caches only in folders of this user's own; point XDG_CACHE_HOME (or the BLOOMLINE_* variable for it) elsewhere"


def owned_dir(path: str | Path) -> Path:
    """``path`` as a folder of this user's: made (mode 0700, parents too) when missing, then
    checked with ``lstat`` (see the module docstring), and each folder above it too: this user's
    or root's, and shared only when sticky, as ``/tmp`` is (else its owner, or anyone who may
    write it, could move this folder away and put another in its place). NotOwned in one line
    otherwise."""
    path = Path(os.path.abspath(path))
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as e:  # a read-only or missing home, a folder of someone else's above it
        raise NotOwned(f"{path} cannot be made ({e.strerror}): {_ADVICE}") from None
    why = _why_not(os.lstat(path), "dir")
    if why:
        raise NotOwned(f"{path} is {why}: {_ADVICE}")
    for parent in path.parents:
        st = os.stat(parent)
        if st.st_uid not in (0, os.getuid()):
            why = f"owned by uid {st.st_uid}"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            why = f"writable by others and not sticky (mode {stat.S_IMODE(st.st_mode):o})"
        else:
            continue
        raise NotOwned(f"{path} lies in {parent}, which is {why}: {_ADVICE}")
    return path


def open_lock(path: str | Path) -> int:
    """A file descriptor of the lock file ``path``, for ``flock``: created 0600 when missing,
    never truncated, never through a symbolic link, and refused (NotOwned, one line) unless a
    regular file of this user's own that only this user may write."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotOwned(f"{path} is a symbolic link: a lock file is never followed; remove it") from None
        raise
    why = _why_not(os.fstat(fd), "file")
    if why:
        os.close(fd)
        raise NotOwned(f"{path} is {why}: a lock file must be this user's own; remove it")
    return fd
