"""Finding the inputs and cutting them into chunks, the unit of parallel work and of resume.

Inputs are JSONL (``.jsonl``, ``.jsonl.gz``), Parquet (``.parquet``) or a dataset saved with
``datasets.Dataset.save_to_disk`` (a folder with ``state.json``; a ``DatasetDict`` folder with
``dataset_dict.json`` is read split by split). A folder is searched recursively.

Plain JSONL is cut at line boundaries every ``read.chunk_bytes``, other formats one file each, and
consecutive small files go together (*bundles*, :func:`plan_chunks`). How much a chunk decodes
to is known before it is read (:func:`chunk_bytes`), so the memory budget checks it up front.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from bloomline import languages
from bloomline.errors import DataError
from bloomline.storage import errors_named, local_copy, open_input, upath
from data_prep.config import ReadConfig, SourceConfig
from data_prep.inputs.ipc_sizes import decoded_bytes
from data_prep.inputs.table_reader import batch_bound


@dataclass(frozen=True)
class Chunk:
    id: int
    path: str
    fmt: str  # jsonl | jsonl.gz | parquet | arrow
    start: int = 0  # byte offset (jsonl); unused otherwise
    end: int = -1  # byte offset, exclusive (jsonl); -1: to the end
    first_line: int = 1
    text_field: str = "text"
    lang_field: str = "lang"
    id_field: str = "id"
    lang: str | None = None
    size: int = 0  # bytes, for progress and scheduling
    members: tuple = ()  # fmt "bundle": the small files it reads one after the other (their chunks' dicts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def paths(self) -> list[str]:
        """The input files this chunk reads."""
        return [m["path"] for m in self.members] if self.members else [self.path]

    def parts(self) -> list["Chunk"]:
        """What the reader reads, in order: the members of a bundle, else the chunk itself."""
        return [Chunk(**m) for m in self.members] if self.members else [self]


def _fmt(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".jsonl") or name.endswith(".json"):
        return "jsonl"
    if name.endswith(".jsonl.gz") or name.endswith(".json.gz"):
        return "jsonl.gz"
    if name.endswith(".parquet"):
        return "parquet"
    return None


def _hf_arrow_files(folder: Path) -> list[Path]:
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        return [f for s in splits for f in _hf_arrow_files(folder / s)]
    state = json.loads((folder / "state.json").read_text())
    return [folder / f["filename"] for f in state["_data_files"]]


def check_readable(path: Path, fmt: str) -> None:
    """Fail early, naming the file, when an input cannot be opened as its format (cheap:
    headers and footers only)."""
    try:
        if fmt == "parquet":
            with open_input(path) as f:
                _ = pq.ParquetFile(f).metadata  # reads the footer: a truncated file fails here
        elif fmt == "arrow":
            with pa.memory_map(local_copy(str(path)), "r") as src:
                _ = pa.ipc.open_stream(src).schema
        elif fmt == "jsonl.gz":
            with gzip.open(open_input(path), "rb") as g:
                g.read(1)
        else:
            with open_input(path) as f:
                f.read(1)
    except (OSError, EOFError, pa.ArrowInvalid) as e:
        raise DataError(f"cannot read input {path} as {fmt}: {e}") from None


def discover(source: SourceConfig, check: bool = False) -> list[tuple[Path, str]]:
    """(file, format) pairs of one source, in a stable (sorted) order; ``check``: also open
    each one (see :func:`check_readable`)."""
    with errors_named(source.path):  # a URL's missing bucket, refused request: one line naming it
        found = _discover(source)
        if check:
            for path, fmt in found:
                check_readable(path, fmt)
    return found


def _discover(source: SourceConfig) -> list[tuple[Path, str]]:
    root = upath(source.path)
    if not root.exists():
        raise DataError(f"input not found: {root}")
    if root.is_file():
        fmt = _fmt(root)
        if fmt is None:
            raise DataError(
                f"unsupported input file {root}: expected .jsonl, .jsonl.gz, .parquet or a saved dataset folder"
            )
        return [(root, fmt)]
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return [(p, "arrow") for p in _hf_arrow_files(root)]
    out: list[tuple[Path, str]] = []
    datasets: set[Path] = set()  # saved datasets found: their own files are theirs, not JSONL records
    for p in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).parts):  # Path's order, for a URL too
        if datasets.intersection(p.parents):
            continue
        if p.is_dir() and (
            ((p / "state.json").is_file() and (p / "dataset_info.json").is_file())
            or (p / "dataset_dict.json").is_file()
        ):
            datasets.add(p)
            out.extend((f, "arrow") for f in _hf_arrow_files(p))
        elif p.is_file() and (fmt := _fmt(p)) and not any(part.startswith(".") for part in p.relative_to(root).parts):
            out.append((p, fmt))
    if not out:
        raise DataError(f"no input files (.jsonl, .jsonl.gz, .parquet, saved dataset) under {root}")
    return out


BUNDLE_FILES = 4096
"""At most this many small files in one bundle (its lists of markers and locations stay small)."""


MIN_BUNDLE = 64 << 10
"""A bundle holds at least this many bytes of records (when there are that many): below it a task's
fixed costs (its markers, drop log and scores files, the scheduler's round trip) dominate."""


BUNDLE_SPREAD = 8
"""Small files' records are cut into about this many bundles (each at least ``MIN_BUNDLE``, at most
the chunk size), so a corpus of small files still makes several tasks to share. A constant, not a
multiple of the worker count: the output's bytes follow the plan, and one worker or sixty must
give the same bytes (tests/flows/cli/test_cli.py)."""


def plan_chunks(
    sources: list[SourceConfig], cfg: ReadConfig, bundle_bytes: int = 0, spread: int = BUNDLE_SPREAD
) -> list[Chunk]:
    """Cut every input into chunks, in a deterministic order. With ``bundle_bytes``, consecutive
    whole files smaller than that are read as one chunk (a *bundle*): a corpus of 10,000 small
    files is not 10,000 tasks of a few documents, each with its own markers, drop log and scores
    files. A bundle holds at most ``bundle_bytes`` of records, and about 1/``spread`` of the small
    files' records (at least ``MIN_BUNDLE``), so a corpus of small files still makes ``spread``
    tasks for the workers to share."""
    chunks = _plan_files(sources, cfg)
    return _bundled(chunks, cfg, bundle_bytes, spread) if bundle_bytes else chunks


def _bundled(chunks: list[Chunk], cfg: ReadConfig, cap: int, spread: int) -> list[Chunk]:
    def est(c: Chunk) -> int:
        whole = c.start == 0 and (c.end < 0 or c.end == c.size)
        return chunk_bytes(upath(c.path), c.fmt, cfg)[0] if whole else cap

    sized = [(c, est(c)) for c in chunks]
    small = sum(e for _, e in sized if e < cap)
    limit = min(cap, max(MIN_BUNDLE, -(-small // max(spread, 1))))
    out: list[Chunk] = []
    group: list[tuple[Chunk, int]] = []

    def close() -> None:
        if len(group) == 1:
            out.append(dataclasses.replace(group[0][0], id=len(out)))
        elif group:
            first = group[0][0]
            out.append(
                Chunk(
                    len(out),
                    first.path,
                    "bundle",
                    size=sum(c.size for c, _ in group),
                    members=tuple(dataclasses.replace(c, id=-1).to_dict() for c, _ in group),
                )
            )
        group.clear()

    for c, e in sized:
        if e >= cap:  # a large file, or a piece of one: a chunk of its own
            close()
            out.append(dataclasses.replace(c, id=len(out)))
            continue
        if group and (sum(x for _, x in group) + e > limit or len(group) >= BUNDLE_FILES):
            close()
        group.append((c, e))
    close()
    return out


def _plan_files(sources: list[SourceConfig], cfg: ReadConfig) -> list[Chunk]:
    if not sources:
        raise DataError("no inputs: give INPUT arguments or 'sources' in the config")
    chunks: list[Chunk] = []
    for src in sources:
        fields = dict(
            text_field=src.text_field or cfg.text_field,
            lang_field=src.lang_field or cfg.lang_field,
            id_field=cfg.id_field,
            lang=languages.resolve(src.lang) if src.lang else None,
        )
        for path, fmt in discover(src):
            try:
                size = path.stat().st_size
                with open_input(path):
                    pass
            except OSError as e:
                raise DataError(f"cannot read input {path}: {e.strerror}") from None
            if fmt == "jsonl":
                for start, end, line in _jsonl_ranges(path, cfg.chunk_bytes):
                    chunks.append(Chunk(len(chunks), str(path), fmt, start, end, line, size=end - start, **fields))
            else:
                chunks.append(Chunk(len(chunks), str(path), fmt, size=size, **fields))
    return chunks


def chunk_bytes(path: Path, fmt: str, cfg: ReadConfig) -> tuple[int, str]:
    """About how many bytes of records the largest chunk of one input holds once read, and how
    that was found: ``read.chunk_bytes`` of a larger JSONL file; a gzip file's text as
    data_prep/inputs/gzipped.py measures it (never its trailer alone); Parquet's uncompressed column
    sizes; an Arrow stream's size, or the decoded size of the batches the reader decodes where
    compression makes that more (data_prep/inputs/ipc_sizes.py: from their metadata, nothing decoded)."""
    size = path.stat().st_size
    if fmt == "jsonl":
        return min(size, cfg.chunk_bytes), "read.chunk_bytes"
    if fmt == "jsonl.gz":
        from data_prep.inputs.gzipped import gzip_text_size

        g = gzip_text_size(path)
        return g.text_bytes, g.how
    if fmt == "parquet":
        with open_input(path) as f:
            md = pq.ParquetFile(f).metadata
        return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)), "its row groups' sizes"
    decoded = decoded_bytes(
        local_copy(str(path)), batch_bound(cfg.max_doc_bytes)
    )  # no more than the file if not compressed
    return (decoded, "its batches' decoded sizes") if decoded > size else (size, "its size")


def _jsonl_ranges(path: Path, chunk_bytes: int) -> Iterator[tuple[int, int, int]]:
    """Byte ranges [start, end) cut after a newline, with the line number each starts at."""
    size = path.stat().st_size
    start, line = 0, 1
    with open_input(path) as f:
        while start < size:
            f.seek(min(start + chunk_bytes, size))
            if f.tell() < size:
                f.readline()  # move to the start of the next line
            end = f.tell()
            yield start, end, line
            # Count the lines of this range to know where the next one starts.
            f.seek(start)
            remaining = end - start
            while remaining > 0:
                block = f.read(min(remaining, 1 << 24))
                line += block.count(b"\n")
                remaining -= len(block)
            start = end
