"""A full disk, told apart from other write failures, so that it ends a command in one line.

A write can fail for want of space in three guises: ``OSError`` with ``ENOSPC`` (or ``EDQUOT``,
a quota), that error wrapped by the library that wrote (Prefect, Dask and pyarrow re-raise it as
the cause of their own), or torch's zip writer, which reports only ``PytorchStreamWriter failed
writing file data/3: file write failed`` or ``basic_ios::clear: iostream error`` (``RuntimeError``s;
DeepSpeed saves through it). Those are taken for a full disk only when the folder's filesystem has
almost no space left.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Optional

from bloomline.errors import BloomlineError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = tuple(os.strerror(n) for n in FULL_ERRNOS)
"""How those errors read once re-raised as text ("No space left on device", "Disk quota exceeded")."""
TORCH_WRITE_FAILED = ("file write failed", "iostream error", "PytorchStreamWriter failed")
"""How torch's zip writer reports a failed write (its C++ stream errors carry no errno)."""
NEARLY_FULL_BYTES = 64 << 20
"""Less free space than this on the folder's filesystem makes torch's bare "file write failed" a full disk."""


class DiskFull(BloomlineError):
    """No space left where a job writes: the user frees space (or picks another folder) and reruns."""


def _chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while e is not None and e not in seen and len(seen) < 20:
        seen.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return seen


def full_disk(e: BaseException, folder: Optional[str | Path] = None) -> bool:
    """Whether ``e`` (or what caused it) is a write that failed for want of space; ``folder``: where
    the job writes, for torch's bare writer error (see the module docstring)."""
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in FULL_ERRNOS:
            return True
        text = str(x)
        if any(words in text for words in FULL_WORDS):  # strerror, as re-raised
            return True
        if any(w in text for w in TORCH_WRITE_FAILED) and folder is not None and free_bytes(folder) < NEARLY_FULL_BYTES:
            return True
    return False


def free_bytes(folder: str | Path) -> int:
    """Free bytes on the filesystem of ``folder`` (of its nearest existing parent)."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 1 << 62  # cannot tell: not full


def disk_full_error(e: BaseException, folder: str | Path) -> DiskFull:
    """The one line a full disk ends a command with, naming ``folder`` (where it writes)."""
    where = next(
        (Path(x.filename).parent for x in _chain(e) if isinstance(x, OSError) and isinstance(x.filename, str)),
        Path(folder),
    )
    return DiskFull(
        f"the disk holding {where} is full (no space left on device; {free_bytes(where) >> 20} MiB free): free some "
        f"space and run the same command again, it goes on from what is finished"
    )
