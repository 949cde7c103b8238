"""Where ``bloomline prepare`` reads from and where its work runs: ``sources:``, ``read:``, ``dask:``, and the least memory a process may have."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bloomline import languages
from bloomline.config import Location, check
from bloomline.host import available_cpus
from bloomline.storage import CREDENTIALS_HINT, has_user_part

MIN_GIB = 0.75
"""The smallest ``memory_gib`` accepted: a process's own baseline and room for one default chunk
(read.chunk_bytes 32 MiB; data_prep/passes/budget.py)."""


@dataclass
class SourceConfig:
    path: Location
    """File or directory: JSONL (.jsonl, .jsonl.gz), Parquet, or a dataset saved with ``datasets``."""
    text_field: Optional[str] = None
    """Field holding the text; None: ``read.text_field``."""
    lang_field: Optional[str] = None
    """Field holding the language label; None: ``read.lang_field``."""
    lang: Optional[str] = None
    """Language of every record of this source (overrides the records' labels)."""

    def validate(self) -> None:
        check(bool(self.path), "path", "must not be empty")
        check(not has_user_part(self.path), "path", CREDENTIALS_HINT)
        if self.lang is not None:
            check(languages.resolve(self.lang) is not None, "lang", f"'{self.lang}' is not one of {languages.KNOWN}")


@dataclass
class ReadConfig:
    text_field: str = "text"
    """Record field holding the document text."""
    lang_field: str = "lang"
    """Record field holding the language label (a code of bloomline.languages or an alias)."""
    id_field: str = "id"
    """Record field holding a document id (optional in the data; ``file:line`` is used when absent)."""
    chunk_bytes: int = 32 * 1024 * 1024
    """Plain JSONL files are cut into chunks of about this size (at line boundaries), the unit
    of parallel work and of resume. Compressed files and Parquet/Arrow files are one chunk each."""
    max_doc_bytes: int = 8 * 1024 * 1024
    """A record larger than this is an error ``too_long`` (it is skipped without being held in memory)."""
    max_expansion: float = 100.0
    """A Parquet or Arrow file is read while its rows decode to at most this many times its size
    on disk (and 64 MiB whatever its size); past that, its remaining rows are one error
    ``expansion`` (a decompression or dictionary bomb: a few KB whose rows repeat one large value
    decode to GiB, and would cost hours). Real text compresses 3-10x."""

    def validate(self) -> None:
        check(self.chunk_bytes >= 1024, "chunk_bytes", "must be at least 1024")
        check(self.max_doc_bytes >= 16, "max_doc_bytes", "must be at least 16")
        check(self.max_expansion >= 1, "max_expansion", "must be at least 1")


@dataclass
class DaskConfig:
    address: Optional[str] = None
    """Address of an existing Dask scheduler (``tcp://host:8786``); None: start a LocalCluster."""
    n_workers: Optional[int] = None
    """LocalCluster worker processes; None: one per core."""
    memory_limit: str = "auto"
    """LocalCluster memory limit per worker (Dask syntax, e.g. ``4GiB``)."""

    def validate(self) -> None:
        check(self.n_workers is None or self.n_workers >= 1, "n_workers", "must be >= 1")
        check(
            self.address is None or not has_user_part(self.address),
            "address",
            "a Dask address takes no user or password (tcp://host:port; a cluster's authentication is its "
            "TLS settings, distributed.comm.tls)",
        )

    def workers(self) -> int:
        return self.n_workers or available_cpus()
