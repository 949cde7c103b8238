"""Where a run's bytes live: a local path, or any fsspec URL (``s3://``, ``gs://``, ``hf://``,
``https://``, ...).

fsspec is the one door to object stores (why: every backend the field uses, S3, GCS, Azure, the
Hugging Face Hub, HTTP, behind one interface that datatrove and ``datasets`` use too). Credentials
come from where each backend looks by itself: the standard environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``;
``GOOGLE_APPLICATION_CREDENTIALS``; ``HF_TOKEN``) or fsspec's own configuration. A recipe never
holds one, so none reaches a manifest, a checkpoint or a run folder; an error from a store is one
line naming the URL, masked (bloomline/secrets.py) like every other line bloomline shows.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from bloomline.errors import BloomlineError

_SCHEME = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*://")


class StorageError(BloomlineError):
    """An object store refused a request, or the object or bucket is not there."""


def scratch_dir() -> Path:
    """This process's own scratch space: a Dask worker's local directory, else ``BLOOMLINE_SCRATCH``
    or ``scratch`` in this user's cache; checked to be this user's own before each use
    (bloomline/owned.py: never a folder another user made first in ``/tmp``)."""
    from bloomline.owned import cache_home, owned_dir

    try:
        from distributed import get_worker

        return owned_dir(get_worker().local_directory)
    except (ImportError, ValueError):
        return owned_dir(os.environ.get("BLOOMLINE_SCRATCH") or cache_home() / "scratch")


def url_key(url: str) -> str:
    """A short name for ``url`` in a local folder (a mirror's, a cache's): the start of its sha256."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def is_url(where: Any) -> bool:
    """Whether ``where`` is a URL of a filesystem other than this machine's (``file://`` is local)."""
    return isinstance(where, str) and bool(_SCHEME.match(where)) and not where.startswith("file://")


def local_path(where: str | Path) -> Path:
    """A local location as a Path (``file://`` stripped)."""
    s = str(where)
    return Path(s[len("file://") :] if s.startswith("file://") else s)


def absolute(where: str | Path) -> str:
    """``where`` as a process elsewhere reads it: a URL as given, a local path resolved."""
    return str(where) if is_url(str(where)) else str(local_path(where).resolve())


def has_user_part(url: str) -> bool:
    """Whether ``url`` carries a user or password (``s3://KEY:SECRET@bucket``, ``https://TOKEN@host``)."""
    from bloomline.secrets import secret_parts

    m = _SCHEME.match(url)
    return bool(m) and ("@" in url[m.end() :].split("/", 1)[0] or bool(secret_parts(url)))


CREDENTIALS_HINT = (
    "a URL with a user or password is refused: it would be readable by every user in the processes' "
    "command lines; put the credentials in the environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, "
    "HF_TOKEN) or fsspec's configuration"
)


def check_no_credentials(url: str, what: str) -> None:
    """Refuse, in one line, a URL that carries credentials: it would stand in the command line of
    every process a run starts (the launcher, the ranks, the watcher), which every user of the
    machine can read in ``/proc/*/cmdline``."""
    if isinstance(url, str) and has_user_part(url):
        from bloomline.secrets import mask_text

        raise StorageError(f"{what} {mask_text(url)}: {CREDENTIALS_HINT}")


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it (fsspec caches the instances); a URL
    with credentials is refused (:func:`check_no_credentials`)."""
    from fsspec.core import url_to_fs

    check_no_credentials(url, "a store's URL")
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise StorageError(f"{url}: cannot open this kind of URL ({_reason(e)})") from None


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def _reason(e: BaseException) -> str:
    from bloomline.secrets import mask_text

    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return mask_text(text)[:300]


def storage_error(url: str, e: BaseException) -> StorageError:
    """One line for a failed request to ``url``: what went wrong in words, the store's own reason
    masked (a store may echo a key id; never the secret, which bloomline never has in a message)."""
    if isinstance(e, StorageError):
        return e
    if isinstance(e, FileNotFoundError):
        what = "not found (no such bucket, object or prefix)"
    elif isinstance(e, PermissionError):
        what = "access denied: check the credentials in the environment (AWS_*, GOOGLE_*, HF_TOKEN)"
    else:
        what = f"the store refused the request ({type(e).__name__})"
    return StorageError(f"{url}: {what}: {_reason(e)}")


@contextlib.contextmanager
def errors_named(url: str) -> Iterator[None]:
    """Turn a store's exceptions in the block into one :class:`StorageError` line naming ``url``."""
    try:
        yield
    except BloomlineError:
        raise
    except (OSError, ValueError, RuntimeError) as e:
        raise storage_error(url, e) from None
    except Exception as e:  # botocore and aiohttp raise their own types through some fsspec paths
        if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "google", "huggingface_hub"):
            raise storage_error(url, e) from None
        raise


def upath(where: str | Path) -> Any:
    """A pathlib-like handle of ``where``: a local Path, or a universal_pathlib ``UPath`` for a URL
    (why: the input readers list, stat and open files through pathlib's methods, which UPath
    gives over any fsspec filesystem)."""
    if not is_url(str(where)):
        return local_path(where)
    from upath import UPath

    return UPath(str(where))


def open_input(where: Any) -> Any:
    """``where`` (a local path, a URL, or a handle of :func:`upath`) opened for binary reading; a
    URL's file reads ranges on demand, so a chunk's seek to its start reads no bytes before it."""
    p = where if hasattr(where, "open") else upath(where)
    if not is_url(str(where)):
        return open(p, "rb")
    import io

    with errors_named(str(p)):
        # buffered as a local file is: the readers call readline(limit), which fsspec's files lack
        return io.BufferedReader(p.open("rb"), buffer_size=1 << 20)


def local_copy(where: str) -> str:
    """A local file with the bytes of ``where``: itself when local; else a copy kept in this
    process's scratch space (bloomline/mirror.py ``scratch_dir``), fetched once and again when the
    object's size or tag changes. For readers that memory-map a whole file (Arrow streams)."""
    if not is_url(where):
        return str(local_path(where))
    from bloomline.io import tmp_path

    fs, path = filesystem(where)
    with errors_named(where):
        info = fs.info(path)
        tag = f"{info.get('size')}-{info.get('ETag') or info.get('etag') or info.get('mtime') or ''}"
        key = hashlib.sha256(f"{where}\0{tag}".encode()).hexdigest()[:24]
        dest = scratch_dir() / "bloomline-inputs" / f"{key}-{Path(path).name}"
        if not dest.exists():
            dest.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = tmp_path(dest)
            try:
                fs.get_file(path, str(tmp))
                tmp.replace(dest)
            finally:
                tmp.unlink(missing_ok=True)
    return str(dest)


def content_digest(paths: Iterable[str | Path]) -> tuple[str, int, int]:
    """sha256 over the files under ``paths``: (digest, files, bytes). Each path (a file, or a folder
    walked in sorted order, hidden entries skipped) is hashed by its files' relative names, sizes
    and bytes; the digest combines those in sorted order. The given paths themselves are not
    hashed: the same files elsewhere give the same digest."""
    from bloomline.io import sha256_tree

    roots = []
    n_files = n_bytes = 0
    for root in map(upath, paths):  # a local path or a URL: the same files give the same digest
        h = hashlib.sha256()
        files = (
            [root]
            if root.is_file()
            else sorted(
                (
                    f
                    for f in root.rglob("*")
                    if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)
                ),
                key=lambda f: f.relative_to(root).parts,
            )
        )
        for f in files:
            rel = f.name if f == root else "/".join(f.relative_to(root).parts)
            size = f.stat().st_size
            h.update(f"{rel}\0{size}\0".encode())
            with open_input(f) as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            n_files += 1
            n_bytes += size
        roots.append(h.hexdigest())
    return sha256_tree(sorted(roots)), n_files, n_bytes
