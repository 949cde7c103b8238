"""Atomic file writes and checksums.

Every file a stage publishes is written to a temporary name in the same folder and renamed into
place (``os.replace`` is atomic on POSIX), so a reader never sees a partial file and a killed
run leaves at worst a temporary file (:func:`tmp_path`: ``NAME.tmp-bloomline-PID``), which the
next run removes from the folders it owns (:func:`remove_stale_tmp`). By default the file is also
fsynced before the rename. The dedup job's and the tokenizer sample's many small markers under
``.work`` skip that (``durable=False``; it cost a third of the dedup stage): a killed process
loses nothing the page cache holds. The data files under ``.work`` were never fsynced, so after
the machine itself crashes mid-run, delete ``DIR/.work`` and run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

TMP_MARK = ".tmp-bloomline-"
"""What every temporary name bloomline writes carries (:func:`tmp_path`), and all that
:func:`remove_stale_tmp` deletes: a user's own ``notes.tmp-1`` is not bloomline's to delete."""
_STALE = re.compile(rf".+{re.escape(TMP_MARK)}\d+", re.DOTALL)


def tmp_path(path: str | Path) -> Path:
    """The temporary name ``path`` is written under before its rename: beside it (same
    filesystem, so the rename is atomic), unique to this process."""
    path = Path(path)
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")


_published = threading.local()


def publish(tmp: str | Path, path: str | Path) -> None:
    """Rename the finished temporary file ``tmp`` to ``path`` (atomic: same folder), and note
    ``path`` in this thread's :func:`journal`, if one is open. Every file a stage publishes goes
    through here, so the order of a journal is the order the files appeared in."""
    os.replace(tmp, path)
    files = getattr(_published, "files", None)
    if files is not None:
        files[Path(path)] = None


@contextlib.contextmanager
def journal() -> Iterator[dict[Path, None]]:
    """The files this thread publishes (:func:`publish`) inside the block, in the order published
    (a dict used as an ordered set). bloomline/mirror.py uploads a folder's files to an object
    store in this order: what a marker marks reaches the store before the marker does."""
    outer = getattr(_published, "files", None)
    _published.files = files = {}
    try:
        yield files
    finally:
        _published.files = outer
        if outer is not None:
            outer.update(files)


def open_journal() -> dict[Path, None] | None:
    """This thread's innermost open :func:`journal`, if any."""
    return getattr(_published, "files", None)


def being_published(path: str | Path) -> bool:
    """Whether this thread published ``path`` inside the journal open now."""
    files = open_journal()
    return files is not None and Path(path) in files


@contextlib.contextmanager
def atomic_path(path: str | Path, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path; on success fsync it (``durable``) and rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        publish(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: str | Path, data: bytes, durable: bool = True) -> None:
    with atomic_path(path, durable) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | Path, obj: Any, durable: bool = True) -> None:
    """Deterministic JSON (sorted keys, fixed indent) written atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode(), durable)


def copy_atomic(src: str | Path, dst: str | Path) -> None:
    """Copy ``src`` to ``dst``, which appears only complete."""
    import shutil

    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_contract_json(path: Path, error: type[Exception], missing_hint: str) -> Any:
    """The JSON of a stage-boundary file (a manifest, a checkpoint's bloomline.json); ``error``
    naming the file when it is absent (with ``missing_hint``) or not valid JSON."""
    if not path.is_file():
        raise error(f"{path} not found: {missing_hint}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise error(f"{path}: not valid JSON ({e})") from None


def sha256_file(path: str | Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def remove_stale_tmp(root: str | Path, owned: Iterable[str] = ()) -> int:
    """Delete the temporary files (:func:`tmp_path`) a killed run left in ``root`` itself and, all
    levels down, in its subfolders ``owned`` (the ones bloomline writes); returns how many.

    Only names that end in :data:`TMP_MARK` and a pid, and only there: ``root`` may be a folder
    of the user's (``--out ~``), whose other files and folders are not bloomline's to touch."""
    root = Path(root)
    found = [*root.glob(f"*{TMP_MARK}*"), *(p for d in owned for p in (root / d).rglob(f"*{TMP_MARK}*"))]
    n = 0
    for p in found:
        if _STALE.fullmatch(p.name) and p.is_file() and not p.is_symlink():
            p.unlink()
            n += 1
    return n


def sha256_tree(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
