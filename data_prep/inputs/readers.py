"""Read step: the records of one chunk (data_prep/inputs/chunk_plan.py) streamed as documents.

Readers stream:
memory is bounded by one record (a record over ``read.max_doc_bytes`` is skipped without being
held whole; Parquet is read a row group at a time, and a row measured before it is decoded:
data_prep/inputs/table_reader.py), never by the size of the corpus.

A *record* is a non-blank line (JSONL) or a row. Every record is booked in the ledger: bad
records become errors with a reason and their ``path:line``.
"""

from __future__ import annotations

import gzip
import json
from typing import Any, Iterator

from bloomline import languages
from bloomline.storage import open_input
from data_prep.config import ReadConfig
from data_prep.inputs.chunk_plan import Chunk
from data_prep.inputs.table_reader import TOO_LONG_CHARS, TableReader
from data_prep.steps.document import UNKNOWN_LANG, Document, Ledger, StrictModeError
from data_prep.steps.step import failure


class ChunkReader(TableReader):
    """Streams the records of one chunk as Documents; bad records go to the ledger (Parquet and
    Arrow rows: data_prep/inputs/table_reader.py)."""

    name = "read"

    def __init__(self, chunk: Chunk, cfg: ReadConfig, ledger: Ledger):
        self.chunk = chunk
        self.part = chunk  # the file being read (a bundle's member, or the chunk)
        self.cfg = cfg
        self.ledger = ledger
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
        if self.ledger.strict:
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
        opener = (
            (lambda p, mode: gzip.open(open_input(p), mode)) if c.fmt == "jsonl.gz" else (lambda p, _: open_input(p))
        )
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
