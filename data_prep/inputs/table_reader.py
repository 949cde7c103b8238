"""Reading the rows of Parquet files and Arrow streams (saved datasets) as records, never holding
more than a bound of them decoded.

A row becomes a record (a dict for data_prep/inputs/readers.py ``_from_record``) only once its size is
known from the Arrow data (data_prep/inputs/row_sizes.py): strings stay dictionaries where the file has
them (Parquet is read with ``read_dictionary`` on every string column, since pyarrow's reader
otherwise decodes a dictionary page into one copy of its value per row; an Arrow stream keeps its
dictionaries), and a batch becomes Python objects a slice of at most ``row_sizes.SLICE_BYTES`` at
a time. A row with a field over ``read.max_doc_bytes`` is booked without that field decoded:

* its text: as ``_from_record`` books a long text (its language checks first, then
  ``empty_text`` or ``too_long``, with the text's first characters), or ``text_not_string``
  when the text is of another type;
* its id or language label: ``too_long``, under ``_unknown``, as a JSONL line over the limit is.

An Arrow stream's record batch whose buffers are compressed is decoded whole by pyarrow, so its
decoded size is read first from the stream's metadata (data_prep/inputs/ipc_sizes.py): a batch over
:func:`batch_bound` is one ``too_long`` error under ``_unknown`` naming its rows (one, not one per
row: its row count is the file's word, and a few KB of file may claim a billion rows), and the
stream is read on without it; a compressed dictionary over the bound ends the file there, with
one such error (the batches after it need it). Each batch read from a stream is checked whole
before its rows are (:func:`_checked`): one that does not hold together ends the file there.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bloomline.errors import DataError
from bloomline.storage import local_copy, open_input, upath
from data_prep.inputs import ipc_sizes
from data_prep.inputs.row_sizes import SLICE_BYTES, Over, head, held_bytes, is_blank, is_text, plan_batch
from data_prep.steps.document import UNKNOWN_LANG, Document
from data_prep.steps.step import failure

TOO_LONG_CHARS = 256
"""The first characters of a too-long text kept for the drop log."""

_STRING_LEAVES = {"STRING", "NONE", "JSON", "BSON", "ENUM"}
"""Logical types of Parquet BYTE_ARRAY columns that pyarrow can read as dictionaries (not decimals)."""


def batch_bound(max_doc_bytes: int) -> int:
    """The most bytes a compressed batch of an Arrow stream may decode to: :data:`SLICE_BYTES`, as
    much as one slice of rows that becomes Python objects at once, or, where ``read.max_doc_bytes``
    is larger, room for a row with its text, label and id each at that limit. A process then holds
    one batch decoded and one slice of it as Python objects, about 0.2 GiB at the defaults."""
    return max(SLICE_BYTES, 4 * max_doc_bytes)


_NOT_TEXT = object()
"""Stands for a text field of another type than string that is too large to decode: whatever it
is, ``_from_record`` books the row ``text_not_string``."""


def open_parquet(path: str) -> pq.ParquetFile:
    """``path`` with every string column, nested ones too, read as a dictionary: a value the file
    stores once stays one value, however many rows point at it."""
    pf = pq.ParquetFile(open_input(path))
    leaves = [pf.schema.column(i) for i in range(len(pf.schema))]
    strings = [c.path for c in leaves if c.physical_type == "BYTE_ARRAY" and c.logical_type.type in _STRING_LEAVES]
    return pq.ParquetFile(open_input(path), metadata=pf.metadata, read_dictionary=strings) if strings else pf


def _checked(batch: pa.RecordBatch, dictionaries: dict[int, tuple[tuple[int, ...], pa.Array]]) -> pa.RecordBatch:
    """``batch`` of an Arrow stream, once its columns hold together: pyarrow checks little of what
    it reads from a stream, and offsets past their data or text not UTF-8 crash Python (a
    segmentation fault) when rows are decoded. A dictionary is checked once while batches share
    it; ``dictionaries`` holds the last one checked of each column (held, so that no other can
    take its address). Raises ArrowInvalid."""
    for i, col in enumerate(batch.columns):
        if not pa.types.is_dictionary(col.type):
            col.validate(full=True)
            continue
        col.indices.validate(full=True)  # each within the dictionary: plan_batch checks
        d = col.dictionary
        key = (d.offset, len(d), *(b.address if b is not None else 0 for b in d.buffers()))
        if i not in dictionaries or dictionaries[i][0] != key:
            d.validate(full=True)
            dictionaries[i] = (key, d)
    return batch


class Expansion(Exception):
    """The rows of a file from ``row`` on would decode past its bound (``read.max_expansion``)."""

    def __init__(self, row: int):
        self.row = row


class TableReader:
    """Parquet and Arrow rows as records, mixed into data_prep/inputs/readers.py ``ChunkReader``, whose
    ``part``, ``cfg``, ``ledger``, ``stats`` and record methods (``_error``, ``_break``,
    ``_isolated``, ``_lang_of``, ``_from_record``) it uses."""

    def _table(self: Any) -> Iterator[Document | None]:
        """The rows of a Parquet file, a row group at a time (a group that fails to decode is one
        error naming its rows; the groups around it are read), or of an Arrow stream (:meth:`_stream`:
        a batch that fails ends the file with one error naming the row)."""
        c = self.part
        try:
            self._decoded, self._allowed = 0.0, max(self.cfg.max_expansion * upath(c.path).stat().st_size, SLICE_BYTES)
            if c.fmt == "parquet":
                pf = open_parquet(c.path)
                names = set(pf.schema_arrow.names)
                groups = [(pf.metadata.row_group(i).num_rows, i) for i in range(pf.num_row_groups)]
            else:
                reader = pa.ipc.open_stream(pa.memory_map(local_copy(c.path), "r"))
                names = set(reader.schema.names)
        except (OSError, ValueError, pa.ArrowException) as e:  # ValueError: a column name not UTF-8
            raise DataError(f"cannot read {c.path}: {e}") from None
        # a forced language leaves the file's label unread; no column at all still counts the rows
        wanted = (c.text_field, None if c.lang else c.lang_field, c.id_field)
        cols = list(dict.fromkeys(x for x in wanted if x in names))
        row = 0
        if c.fmt == "parquet":
            for n, i in groups:
                # A row group at once: read as dictionaries in batches, a column whose pages fall back
                # from dictionary to plain encoding comes with the dictionary of every value read so
                # far in each batch, copied each time (quadratic in the group). Whole, a group takes
                # about twice its size while pyarrow builds it (measured: +64 MiB of peak for a 41 MB
                # group in the chunks pass), within the 8 bytes per byte of input the budget allows
                # (data_prep/passes/budget.py, from the same metadata).
                first = row
                try:
                    group = pf.read_row_group(i, columns=cols)
                except (OSError, pa.ArrowException) as e:
                    self._break(e, f"row group {i} (rows {first:,} to {first + n - 1:,}) from row {row:,}")
                    group = pa.table({})
                try:
                    for batch in group.to_batches():
                        yield from self._rows(batch, row)
                        row += batch.num_rows
                except Expansion as e:
                    self._expanded(e.row, pf.metadata.num_rows)
                    return
                row = first + n
            return
        try:
            yield from self._stream(reader, cols)
        except Expansion as e:
            self._expanded(e.row, None)

    def _expanded(self: Any, row: int, rows: int | None) -> None:
        """Book the rest of a file whose rows decode to more than ``read.max_expansion`` times its
        size: one error naming them, none of them decoded."""
        c = self.part
        rest = f"rows {row:,} to {rows - 1:,}" if rows is not None else f"from row {row:,}"
        self.stats["records"] += 1
        self._error(
            UNKNOWN_LANG,
            "expansion",
            f"{c.path}: {rest} not read: its rows decode to more than read.max_expansion="
            f"{self.cfg.max_expansion:g} times the file's {upath(c.path).stat().st_size:,} bytes",
        )

    def _stream(self: Any, reader: pa.ipc.RecordBatchStreamReader, cols: list[str]) -> Iterator[Document | None]:
        """The rows of an Arrow stream, a batch at a time, each batch's size known before it is
        decoded (data_prep/inputs/ipc_sizes.py): a compressed one over :func:`batch_bound` is booked
        undecoded (the module's docstring says how), and the stream read without it."""
        c = self.part
        bound = batch_bound(self.cfg.max_doc_bytes)
        scan = ipc_sizes.scan(local_copy(c.path))
        heavy = scan.over(bound)
        skipped = {m.start for m in heavy}
        dictionaries: dict[int, tuple[tuple[int, ...], pa.Array]] = {}
        row = 0
        try:
            if heavy:  # pyarrow's reader would decode each of them whole, on its way to the next batch
                reader = pa.ipc.open_stream(ipc_sizes.Without(local_copy(c.path), heavy))
            for m in scan.messages:
                if m.start in skipped:
                    self.stats["records"] += 1
                    what = (
                        f"a compressed {'record' if m.kind == 'batch' else m.kind} batch, {m.decoded:,} bytes decoded"
                    )
                    if m.kind == "dictionary":  # the batches after it may need it
                        self._error(UNKNOWN_LANG, "too_long", f"{c.path}: from row {row} ({what})")
                        return
                    rows = f"row {row}" if m.rows <= 1 else f"rows {row} to {row + m.rows - 1}"
                    self._error(UNKNOWN_LANG, "too_long", f"{c.path}:{rows} ({what})")
                    row += m.rows
                elif m.kind == "batch":  # (a dictionary is read by pyarrow with the next batch)
                    batch = reader.read_next_batch()
                    yield from self._rows(_checked(batch.select(cols), dictionaries), row)
                    row += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            self._break(e, f"at row {row:,}")
            return
        if scan.error is not None:  # where the stream cannot be read past (its metadata)
            self._break(scan.error, f"at row {row:,}")

    def _rows(self: Any, batch: pa.RecordBatch, first: int) -> Iterator[Document | None]:
        """The records of one batch: slices decoded in turn, the rows over the limit booked."""
        c = self.part
        try:
            plan = plan_batch(batch, c.text_field, self.cfg.max_doc_bytes)
        except (pa.ArrowException, ValueError, TypeError) as e:  # a column that cannot be measured
            yield from self._failed(batch.num_rows, first, e)
            return
        sizes = None
        for step in plan:
            if not isinstance(step, Over):  # rows to decode: within the file's bound (read.max_expansion)
                if sizes is None:
                    sizes = np.cumsum([0.0, *sum((held_bytes(col) for col in batch.columns), np.zeros(batch.num_rows))])
                self._decoded += sizes[step[1]] - sizes[step[0]]
                if self._decoded > self._allowed:
                    raise Expansion(first + step[0])
            if isinstance(step, Over):
                loc = f"{c.path}:row {first + step.row}"
                self.stats["records"] += 1
                yield self._isolated(lambda: self._over(batch, step, loc), loc, None)
            else:
                yield from self._slice(batch.slice(step[0], step[1] - step[0]), first + step[0])

    def _failed(self: Any, n: int, first: int, e: BaseException) -> Iterator[None]:
        """``n`` rows from ``first`` that cannot be read: each one error ``read.<exception>``."""
        for k in range(n):
            self.stats["records"] += 1
            self._error(UNKNOWN_LANG, failure("read", e), f"{self.part.path}:row {first + k}")
            yield None

    def _slice(self: Any, batch: pa.RecordBatch, first: int) -> Iterator[Document | None]:
        c = self.part
        try:
            # decoded first: the slice's values only (a dictionary read whole holds its group's), and
            # pyarrow turns plain strings into Python ones faster than dictionary entries
            cols = [x.dictionary_decode() if pa.types.is_dictionary(x.type) else x for x in batch.columns]
            recs = (
                pa.RecordBatch.from_arrays(cols, names=batch.schema.names).to_pylist()
                if cols
                else [{} for _ in range(batch.num_rows)]  # none of the fields: each row is still a record, booked
            )
        except (pa.ArrowException, ValueError, RecursionError) as e:  # a value Python cannot hold
            yield from self._failed(batch.num_rows, first, e)
            return
        for k, rec in enumerate(recs):
            loc = f"{c.path}:row {first + k}"
            self.stats["records"] += 1
            raw = rec.get(c.text_field) if isinstance(rec, dict) and isinstance(rec.get(c.text_field), str) else None
            yield self._isolated(lambda: self._from_record(rec, loc, raw), loc, raw)

    def _over(self: Any, batch: pa.RecordBatch, over: Over, loc: str) -> None:
        """Book a row with fields over ``read.max_doc_bytes`` (the module's docstring says how),
        decoding only its other fields and the first characters of its text."""
        c = self.part
        names = batch.schema.names
        rec = batch.slice(over.row, 1).select([i for i, x in enumerate(names) if x not in over.fields]).to_pylist()[0]
        text = batch.column(names.index(c.text_field)) if c.text_field in names else None
        long_text = c.text_field in over.fields
        if over.fields - {c.text_field}:  # its id or label alone is over the limit
            clip = head(text, over.row, TOO_LONG_CHARS) if long_text and is_text(text.type) else rec.get(c.text_field)
            self._error(UNKNOWN_LANG, "too_long", loc, clip if isinstance(clip, str) else None)
            return None
        if not is_text(text.type):
            rec[c.text_field] = _NOT_TEXT
            return self._from_record(rec, loc, None)
        # as many characters as a record's raw text gives the drop log (data_prep/storage/droplog.py)
        log_chars = self.ledger.log.text_chars if self.ledger.log is not None else 0
        clip = head(text, over.row, max(TOO_LONG_CHARS, log_chars))
        lang = self._lang_of(rec, loc, clip)
        if lang is not None:
            blank = is_blank(text, over.row)
            self._error(lang, "empty_text" if blank else "too_long", loc, clip if blank else clip[:TOO_LONG_CHARS])
        return None
