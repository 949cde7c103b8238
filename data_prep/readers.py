"""Read step: input discovery, chunk planning and streaming readers.

Inputs are JSONL (``.jsonl``, ``.jsonl.gz``), Parquet (``.parquet``) or a dataset saved with
``datasets.Dataset.save_to_disk`` (a folder with ``state.json``; a ``DatasetDict`` folder with
``dataset_dict.json`` is read split by split). A folder is searched recursively.

Work is cut into *chunks*: plain JSONL at line boundaries every ``read.chunk_bytes``, other
formats one file each. A chunk is the unit of parallel work and of resume. Readers stream:
memory is bounded by one record (a record over ``read.max_doc_bytes`` is skipped without being
held whole), never by the size of the corpus.

A *record* is a non-blank line (JSONL) or a row. Every record is booked in the ledger: bad
records become errors with a reason and their ``path:line``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from bloomline import languages
from bloomline.errors import DataError
from data_prep.config import ReadConfig, SourceConfig
from data_prep.document import UNKNOWN_LANG, Document, Ledger, StrictModeError


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
            pq.ParquetFile(path).metadata
        elif fmt == "arrow":
            with pa.memory_map(str(path), "r") as src:
                pa.ipc.open_stream(src).schema
        elif fmt == "jsonl.gz":
            with gzip.open(path, "rb") as g:
                g.read(1)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except (OSError, EOFError, pa.ArrowInvalid) as e:
        raise DataError(f"cannot read input {path} as {fmt}: {e}") from None


def discover(source: SourceConfig, check: bool = False) -> list[tuple[Path, str]]:
    """(file, format) pairs of one source, in a stable (sorted) order; ``check``: also open
    each one (see :func:`check_readable`)."""
    found = _discover(source)
    if check:
        for path, fmt in found:
            check_readable(path, fmt)
    return found


def _discover(source: SourceConfig) -> list[tuple[Path, str]]:
    root = Path(source.path)
    if not root.exists():
        raise DataError(f"input not found: {root}")
    if root.is_file():
        fmt = _fmt(root)
        if fmt is None:
            raise DataError(f"unsupported input file {root}: expected .jsonl, .jsonl.gz, .parquet or a saved dataset folder")
        return [(root, fmt)]
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return [(p, "arrow") for p in _hf_arrow_files(root)]
    out: list[tuple[Path, str]] = []
    for p in sorted(root.rglob("*")):
        if p.is_dir() and ((p / "state.json").is_file() and (p / "dataset_info.json").is_file()):
            out.extend((f, "arrow") for f in _hf_arrow_files(p))
        elif p.is_file() and (fmt := _fmt(p)) and not any(part.startswith(".") for part in p.relative_to(root).parts):
            out.append((p, fmt))
    if not out:
        raise DataError(f"no input files (.jsonl, .jsonl.gz, .parquet, saved dataset) under {root}")
    return out


def plan_chunks(sources: list[SourceConfig], cfg: ReadConfig) -> list[Chunk]:
    """Cut every input into chunks, in a deterministic order."""
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
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise DataError(f"cannot read input {path}: {e.strerror}") from None
            if fmt == "jsonl":
                for start, end, line in _jsonl_ranges(path, cfg.chunk_bytes):
                    chunks.append(Chunk(len(chunks), str(path), fmt, start, end, line, size=end - start, **fields))
            else:
                chunks.append(Chunk(len(chunks), str(path), fmt, size=size, **fields))
    return chunks


def chunk_bytes(path: Path, fmt: str, cfg: ReadConfig) -> int:
    """About how many bytes of records the largest chunk of one input holds once read (nothing is
    parsed): ``read.chunk_bytes`` of a larger JSONL file; the gzip trailer's uncompressed size
    (modulo 4 GiB, as gzip keeps it, so at least the file's size); Parquet's uncompressed column
    sizes; an Arrow file's size."""
    size = path.stat().st_size
    if fmt == "jsonl":
        return min(size, cfg.chunk_bytes)
    if fmt == "jsonl.gz":
        with open(path, "rb") as f:
            f.seek(-4, 2)
            return max(int.from_bytes(f.read(4), "little"), size)
    if fmt == "parquet":
        md = pq.ParquetFile(path).metadata
        return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return size


def _jsonl_ranges(path: Path, chunk_bytes: int) -> Iterator[tuple[int, int, int]]:
    """Byte ranges [start, end) cut after a newline, with the line number each starts at."""
    size = path.stat().st_size
    start, line = 0, 1
    with open(path, "rb") as f:
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


class ChunkReader:
    """Streams the records of one chunk as Documents; bad records go to the ledger."""

    name = "read"

    def __init__(self, chunk: Chunk, cfg: ReadConfig, ledger: Ledger, strict: bool = False):
        self.chunk = chunk
        self.cfg = cfg
        self.ledger = ledger
        self.strict = strict
        self.stats = {"records": 0, "docs_out": 0, "bytes": 0}
        self.dropped: dict[str, int] = {}
        self.seconds = 0.0

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.stats)
        if self.dropped:
            out["dropped"] = dict(sorted(self.dropped.items()))
        return out

    def _error(self, lang: str, reason: str, loc: str) -> None:
        if self.strict:
            raise StrictModeError(f"{loc}: {reason} (--strict stops at the first bad record)")
        self.ledger.record_in(lang)
        self.ledger.drop(lang, "errors", reason, loc)
        if self.ledger.log is not None:  # the record could not be read: no id or text to log
            self.ledger.log.add(id=None, source=loc, lang=lang, stage="read", outcome="errors", reason=reason)
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def run(self) -> Iterator[Document]:
        import time

        t0 = time.perf_counter()
        it = self._jsonl() if self.chunk.fmt.startswith("jsonl") else self._table()
        pos = 0
        for item in it:
            self.seconds += time.perf_counter() - t0
            if item is not None:
                item.pos = pos
                pos += 1
                self.stats["docs_out"] += 1
                yield item
            t0 = time.perf_counter()
        self.seconds += time.perf_counter() - t0

    # -- records -> documents --------------------------------------------------------------
    def _from_record(self, rec: Any, loc: str) -> Document | None:
        c = self.chunk
        self.stats["records"] += 1
        if not isinstance(rec, dict):
            self._error(UNKNOWN_LANG, "not_an_object", loc)
            return None
        label = c.lang if c.lang else rec.get(c.lang_field)
        lang = languages.resolve(label) if isinstance(label, str) else None
        if label is None:
            self._error(UNKNOWN_LANG, "missing_lang", loc)
            return None
        if lang is None:
            self._error(UNKNOWN_LANG, "unknown_lang", f"{loc} (lang={label!r})")
            return None
        text = rec.get(c.text_field)
        if text is None:
            self._error(lang, "missing_text", loc)
            return None
        if not isinstance(text, str):
            self._error(lang, "text_not_string", loc)
            return None
        if not text.strip():
            self._error(lang, "empty_text", loc)
            return None
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        if n_bytes > self.cfg.max_doc_bytes:
            self._error(lang, "too_long", loc)
            return None
        self.stats["bytes"] += n_bytes
        self.ledger.record_in(lang)
        doc_id = rec.get(c.id_field)
        return Document(text=text, lang=lang, id=str(doc_id) if doc_id is not None else loc, loc=loc)

    def _jsonl(self) -> Iterator[Document | None]:
        c = self.chunk
        limit = self.cfg.max_doc_bytes + 1
        opener = gzip.open if c.fmt == "jsonl.gz" else open
        line_no = c.first_line - 1
        with opener(c.path, "rb") as f:
            if c.start:
                f.seek(c.start)
            pos = c.start
            while c.end < 0 or pos < c.end:
                try:
                    raw = f.readline(limit)
                except (OSError, EOFError) as e:  # truncated / corrupt gzip
                    self._error(UNKNOWN_LANG, "unreadable", f"{c.path}:{line_no + 1} ({e})")
                    return
                if not raw:
                    break
                pos += len(raw)
                line_no += 1
                loc = f"{c.path}:{line_no}"
                if not raw.endswith(b"\n") and len(raw) == limit:
                    # Over the size limit: skip the rest of the line without holding it.
                    while True:
                        more = f.readline(1 << 20)
                        pos += len(more)
                        if not more or more.endswith(b"\n"):
                            break
                    self.stats["records"] += 1
                    self._error(UNKNOWN_LANG, "too_long", loc)
                    yield None
                    continue
                if not raw.strip():
                    continue  # blank line: not a record
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    self.stats["records"] += 1
                    lang = UNKNOWN_LANG
                    try:  # book it under its language when the rest of the line is readable
                        rec = json.loads(raw.decode("utf-8", "replace"))
                        lab = self.chunk.lang or (rec.get(c.lang_field) if isinstance(rec, dict) else None)
                        lang = languages.resolve(lab) or UNKNOWN_LANG if isinstance(lab, str) else UNKNOWN_LANG
                    except ValueError:
                        pass
                    self._error(lang, "invalid_utf8", loc)
                    yield None
                    continue
                try:
                    rec = json.loads(text)
                except ValueError:
                    self.stats["records"] += 1
                    self._error(UNKNOWN_LANG, "malformed_json", loc)
                    yield None
                    continue
                yield self._from_record(rec, loc)

    def _table(self) -> Iterator[Document | None]:
        c = self.chunk
        try:
            if c.fmt == "parquet":
                pf = pq.ParquetFile(c.path)
                names = set(pf.schema_arrow.names)
                cols = [x for x in (c.text_field, c.lang_field, c.id_field) if x in names]
                batches = pf.iter_batches(batch_size=1024, columns=cols or None)
            else:
                reader = pa.ipc.open_stream(pa.memory_map(c.path, "r"))
                names = set(reader.schema.names)
                cols = [x for x in (c.text_field, c.lang_field, c.id_field) if x in names]
                batches = (b.select(cols) for b in reader)
        except (OSError, pa.ArrowInvalid) as e:
            raise DataError(f"cannot read {c.path}: {e}") from None
        row = 0
        for batch in batches:
            for rec in batch.to_pylist():
                yield self._from_record(rec, f"{c.path}:row {row}")
                row += 1
