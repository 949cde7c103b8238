"""Read step: input discovery, chunk planning and streaming readers.

Inputs are JSONL (``.jsonl``, ``.jsonl.gz``), Parquet (``.parquet``) or a dataset saved with
``datasets.Dataset.save_to_disk`` (a folder with ``state.json``; a ``DatasetDict`` folder with
``dataset_dict.json`` is read split by split). A folder is searched recursively.

Work is cut into *chunks*: plain JSONL at line boundaries every ``read.chunk_bytes``, other
formats one file each, and consecutive small files together (*bundles*, :func:`plan_chunks`).
A chunk is the unit of parallel work and of resume. Readers stream:
memory is bounded by one record (a record over ``read.max_doc_bytes`` is skipped without being
held whole; Parquet is read a row group at a time, and a row measured before it is decoded:
data_prep/inputs/table_reader.py), never by the size of the corpus.

A *record* is a non-blank line (JSONL) or a row. Every record is booked in the ledger: bad
records become errors with a reason and their ``path:line``.
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
from data_prep.config import ReadConfig, SourceConfig
from data_prep.inputs.ipc_sizes import decoded_bytes
from data_prep.inputs.table_reader import TOO_LONG_CHARS, TableReader, batch_bound
from data_prep.steps.document import UNKNOWN_LANG, Document, Ledger, StrictModeError
from data_prep.steps.step import failure


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
            _ = pq.ParquetFile(path).metadata  # reads the footer: a truncated file fails here
        elif fmt == "arrow":
            with pa.memory_map(str(path), "r") as src:
                _ = pa.ipc.open_stream(src).schema
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
            raise DataError(
                f"unsupported input file {root}: expected .jsonl, .jsonl.gz, .parquet or a saved dataset folder"
            )
        return [(root, fmt)]
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return [(p, "arrow") for p in _hf_arrow_files(root)]
    out: list[tuple[Path, str]] = []
    datasets: set[Path] = set()  # saved datasets found: their own files are theirs, not JSONL records
    for p in sorted(root.rglob("*")):
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
give the same bytes (tests/flows/test_cli.py)."""


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
        return chunk_bytes(Path(c.path), c.fmt, cfg)[0] if whole else cap

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
        md = pq.ParquetFile(path).metadata
        return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)), "its row groups' sizes"
    decoded = decoded_bytes(str(path), batch_bound(cfg.max_doc_bytes))  # no more than the file if not compressed
    return (decoded, "its batches' decoded sizes") if decoded > size else (size, "its size")


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


class ChunkReader(TableReader):
    """Streams the records of one chunk as Documents; bad records go to the ledger (Parquet and
    Arrow rows: data_prep/inputs/table_reader.py)."""

    name = "read"

    def __init__(self, chunk: Chunk, cfg: ReadConfig, ledger: Ledger, strict: bool = False):
        self.chunk = chunk
        self.part = chunk  # the file being read (a bundle's member, or the chunk)
        self.cfg = cfg
        self.ledger = ledger
        self.strict = strict
        self.stats = {"records": 0, "docs_out": 0, "bytes": 0}
        self.dropped: dict[str, int] = {}
        self.seconds = 0.0
        self.pos = 0
        """Documents yielded so far: the position the next one takes."""

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.stats)
        if self.dropped:
            out["dropped"] = dict(sorted(self.dropped.items()))
        return out

    def _error(self, lang: str, reason: str, loc: str, raw: bytes | str | None = None) -> None:
        """Book one record (or one break in a file) as an error: the ledger, and a row of the drop
        log with the first characters of its raw text (there is no id or document to log)."""
        if self.strict:
            raise StrictModeError(f"{loc}: {reason} (--strict stops at the first bad record)")
        self.ledger.record_in(lang)
        self.ledger.drop(lang, "errors", reason, loc)
        if self.ledger.log is not None:
            text = raw.rstrip(b"\r\n").decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            self.ledger.log.add(
                id=None, source=loc, lang=lang, stage="read", outcome="errors", reason=reason, text=text, pos=self.pos
            )
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _isolated(self, make: Any, loc: str, raw: Any) -> Document | None:
        """``make()``, the reading of one record, with whatever it raises booked as that record's
        error: ``too_deep`` for nesting past Python's recursion limit (valid JSON, 5,000 ``[``
        deep, that ``json`` cannot parse; the limit is not raised, that would only move the
        crash), else ``read.<exception class>`` (data_prep/steps/step.py failure). One record never stops a run (unless --strict)."""
        try:
            return make()
        except StrictModeError:
            raise
        except RecursionError:
            self._error(UNKNOWN_LANG, "too_deep", loc, raw)
        except Exception as e:  # noqa: BLE001 - any failure of one record is that record's
            self._error(UNKNOWN_LANG, failure("read", e), loc, raw)
        return None

    def _break(self, e: BaseException, where: str) -> None:
        """A file that cannot be read past a point: one error naming the file and the point; the
        records before it stand."""
        import zlib

        reason = (
            "truncated_gzip"
            if isinstance(e, EOFError)
            else "corrupt_gzip"
            if isinstance(e, (gzip.BadGzipFile, zlib.error))
            else "unreadable"
        )
        self.stats["records"] += 1
        self._error(UNKNOWN_LANG, reason, f"{self.part.path}: {where} ({type(e).__name__}: {e})")

    def run(self) -> Iterator[Document]:
        import time

        t0 = time.perf_counter()
        for item in self._records():
            self.seconds += time.perf_counter() - t0
            if item is not None:
                item.pos = self.pos
                self.pos += 1
                self.stats["docs_out"] += 1
                yield item
            t0 = time.perf_counter()
        self.seconds += time.perf_counter() - t0

    def _records(self) -> Iterator[Document | None]:
        for part in self.chunk.parts():
            self.part = part
            yield from self._jsonl() if part.fmt.startswith("jsonl") else self._table()

    # -- records -> documents --------------------------------------------------------------
    def _lang_of(self, rec: Any, loc: str, raw: Any) -> str | None:
        """The language of a record, or None with the record booked as an error (not an object, no
        label, a label that is no language)."""
        c = self.part
        if not isinstance(rec, dict):
            self._error(UNKNOWN_LANG, "not_an_object", loc, raw)
            return None
        label = c.lang if c.lang else rec.get(c.lang_field)
        lang = languages.resolve(label) if isinstance(label, str) else None
        if label is None:
            self._error(UNKNOWN_LANG, "missing_lang", loc, raw)
        elif lang is None:
            self._error(UNKNOWN_LANG, "unknown_lang", f"{loc} (lang={label!r:.80})", raw)
        return lang

    def _from_record(self, rec: Any, loc: str, raw: Any = None) -> Document | None:
        c = self.part
        lang = self._lang_of(rec, loc, raw)
        if lang is None:
            return None
        text = rec.get(c.text_field)
        if text is None:
            self._error(lang, "missing_text", loc, raw)
            return None
        if not isinstance(text, str):
            self._error(lang, "text_not_string", loc, raw)
            return None
        if not text.strip():
            self._error(lang, "empty_text", loc, raw)
            return None
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        if n_bytes > self.cfg.max_doc_bytes:
            self._error(lang, "too_long", loc, text[:TOO_LONG_CHARS])
            return None
        doc_id = rec.get(c.id_field)
        doc_id = str(doc_id) if doc_id is not None else loc  # before the ledger: str() of a strange id may raise
        self.stats["bytes"] += n_bytes
        self.ledger.record_in(lang)
        return Document(text=text, lang=lang, id=doc_id, loc=loc)

    def _jsonl(self) -> Iterator[Document | None]:
        import zlib

        c = self.part
        limit = self.cfg.max_doc_bytes + 1
        opener = gzip.open if c.fmt == "jsonl.gz" else open
        line_no = c.first_line - 1
        pos = c.start
        try:
            f = opener(c.path, "rb")
            if c.start:
                f.seek(c.start)
        except OSError as e:
            self._break(e, "cannot be opened")
            return
        with f:
            while c.end < 0 or pos < c.end:
                try:
                    raw = f.readline(limit)
                except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip, an I/O error
                    self._break(e, f"at byte {pos:,} of its text, after line {line_no:,}")
                    return
                if not raw:
                    break
                pos += len(raw)
                line_no += 1
                loc = f"{c.path}:{line_no}"
                if not raw.endswith(b"\n") and len(raw) == limit:
                    # Over the size limit: skip the rest of the line without holding it.
                    try:
                        while True:
                            more = f.readline(1 << 20)
                            pos += len(more)
                            if not more or more.endswith(b"\n"):
                                break
                    except (OSError, EOFError, zlib.error) as e:
                        self._break(e, f"at byte {pos:,} of its text, in line {line_no:,}")
                        return
                    self.stats["records"] += 1
                    self._error(UNKNOWN_LANG, "too_long", loc, raw[:TOO_LONG_CHARS])
                    yield None
                    continue
                if not raw.strip():
                    continue  # blank line: not a record
                self.stats["records"] += 1
                yield self._isolated(lambda: self._from_line(raw, loc), loc, raw)

    def _from_line(self, raw: bytes, loc: str) -> Document | None:
        """One non-blank JSONL line: decoded, parsed, checked."""
        c = self.part
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            lang = UNKNOWN_LANG
            try:  # book it under its language when the rest of the line is readable
                rec = json.loads(raw.decode("utf-8", "replace"))
                lab = c.lang or (rec.get(c.lang_field) if isinstance(rec, dict) else None)
                lang = languages.resolve(lab) or UNKNOWN_LANG if isinstance(lab, str) else UNKNOWN_LANG
            except (ValueError, RecursionError):
                pass
            self._error(lang, "invalid_utf8", loc, raw)
            return None
        try:
            rec = json.loads(text)
        except ValueError:
            self._error(UNKNOWN_LANG, "malformed_json", loc, raw)
            return None
        return self._from_record(rec, loc, raw)
