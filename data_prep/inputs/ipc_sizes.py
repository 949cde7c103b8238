"""What each message of an Arrow IPC stream (a saved dataset's file) decodes to, known from its
metadata before anything is decoded, and a view of a stream without some of its messages.

A record batch whose buffers are compressed (LZ4_FRAME or ZSTD) holds far more than its file:
2.6 KB of ZSTD is 64 MiB decoded, and pyarrow's stream reader decompresses a batch whole before
anyone sees it (issue 37). Each compressed buffer starts with its decoded length (8 bytes,
little-endian; -1: the buffer is stored as it is), so a batch's decoded size is read from its
metadata and 8 bytes per buffer. The metadata is a flatbuffer (Arrow's format/Message.fbs,
which pyarrow verifies before handing it over); the few fields needed are read here by hand, and
every offset is checked again against the bytes there are (a buffer's against its body): it all
comes from the file. data_prep/inputs/table_reader.py reads a stream without the batches over its bound
(:class:`Without`); data_prep/inputs/chunk_plan.py counts a stream at its decoded size for the memory budget.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

_DICTIONARY, _RECORD_BATCH = 2, 3
"""Message.header's types (the union MessageHeader) that hold data; a Schema is 1."""


@dataclass(frozen=True)
class Message:
    """A dictionary batch or record batch of a stream, as its metadata describes it."""

    kind: str
    """``"dictionary"`` or ``"batch"``."""
    rows: int
    decoded: int
    """Bytes its buffers take once decoded (their stored length where not compressed)."""
    compressed: bool
    start: int
    end: int
    """Where the message lies in the file, ``[start, end)``."""


@dataclass(frozen=True)
class Scan:
    messages: list[Message]
    """The stream's dictionary and record batches, in order."""
    error: Exception | None
    """Why the scan stopped before the end of the stream (after ``messages``), or None."""

    def over(self, bound: int) -> list[Message]:
        """The compressed messages that decode to more than ``bound`` bytes (pyarrow's reader
        decodes a message whole; one stored as it is is a slice of the memory-mapped file)."""
        return [m for m in self.messages if m.compressed and m.decoded > bound]


def _at(fmt: str, buf: memoryview, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError("a message's metadata points outside itself")
    return struct.unpack_from(fmt, buf, pos)[0]


def _field(buf: memoryview, table: int, i: int) -> int | None:
    """Where field ``i`` of the flatbuffer table at ``table`` lies, or None when it is absent."""
    vtable = table - _at("<i", buf, table)
    if 4 + 2 * i + 2 > _at("<H", buf, vtable):
        return None
    off = _at("<H", buf, vtable + 4 + 2 * i)
    return table + off if off else None


def _deref(buf: memoryview, pos: int) -> int:
    return pos + _at("<I", buf, pos)


def message_sizes(msg: pa.ipc.Message, start: int, end: int) -> Message | None:
    """``msg`` (at ``[start, end)`` of its file) as a :class:`Message`; None for a schema. A
    message whose metadata does not hold together raises ValueError."""
    md = memoryview(msg.metadata)
    root = _deref(md, 0)
    kind_at, header_at = _field(md, root, 1), _field(md, root, 2)
    kind = _at("<B", md, kind_at) if kind_at is not None else 0
    if kind not in (_DICTIONARY, _RECORD_BATCH):
        if msg.type == "schema":
            return None
        raise ValueError(f"an unexpected {msg.type} message in a stream")
    if header_at is None:
        raise ValueError("a batch without its header")
    batch = _deref(md, header_at)
    if kind == _DICTIONARY:  # DictionaryBatch { id, data: RecordBatch, isDelta }
        data = _field(md, batch, 1)
        if data is None:
            raise ValueError("a dictionary batch without its data")
        batch = _deref(md, data)
    # RecordBatch { length: long, nodes, buffers: [Buffer { offset: long, length: long }], compression }
    length_at, buffers_at = _field(md, batch, 0), _field(md, batch, 2)
    rows = _at("<q", md, length_at) if length_at is not None else 0
    compressed = _field(md, batch, 3) is not None
    body = memoryview(msg.body) if msg.body is not None else memoryview(b"")
    decoded = 0
    if buffers_at is not None:
        vec = _deref(md, buffers_at)
        n = _at("<I", md, vec)
        if vec + 4 + 16 * n > len(md):
            raise ValueError("a message's metadata points outside itself")
        for k in range(n):
            off, size = _at("<q", md, vec + 4 + 16 * k), _at("<q", md, vec + 12 + 16 * k)
            if off < 0 or size < 0 or off + size > len(body):
                raise ValueError("a buffer outside its message's body")
            if not compressed or not size:  # an empty buffer may be stored without its prefix
                decoded += size
                continue
            prefix = _at("<q", body, off) if size >= 8 else -2
            if prefix < -1:
                raise ValueError("a compressed buffer without its decoded length")
            decoded += size - 8 if prefix == -1 else prefix
    if rows < 0:
        raise ValueError("a batch of a negative number of rows")
    return Message("dictionary" if kind == _DICTIONARY else "batch", rows, decoded, compressed, start, end)


def scan(path: str) -> Scan:
    """Every dictionary and record batch of the stream file at ``path``, read from their metadata
    and buffer prefixes only (the file is memory-mapped: nothing else is read)."""
    messages: list[Message] = []
    try:
        with pa.memory_map(path, "r") as src:
            reader = pa.ipc.MessageReader.open_stream(src)
            start = src.tell()
            for msg in reader:
                if (m := message_sizes(msg, start, src.tell())) is not None:
                    messages.append(m)
                start = src.tell()
    except (OSError, ValueError, pa.ArrowException) as e:
        return Scan(messages, e)
    return Scan(messages, None)


def decoded_bytes(path: str, bound: int) -> int:
    """The bytes of the stream file at ``path`` that a reader decodes when it leaves undecoded the
    messages over ``bound`` (:meth:`Scan.over`): its other batches' and dictionaries' buffers, up
    to where it cannot be read."""
    s = scan(path)
    return sum(m.decoded for m in s.messages) - sum(m.decoded for m in s.over(bound))


class Without:
    """The stream file at ``path`` read as if the messages ``skip`` were not there: handed to
    ``pa.ipc.open_stream`` in place of the file (pyarrow reads a Python file object through its
    ``read``). A read within one kept range is a slice of the memory map, not a copy. Why a view:
    pyarrow's stream reader cannot skip a message, and ``pa.ipc.read_record_batch`` of the
    messages one by one cannot be given the stream's dictionaries (its DictionaryMemo has no way
    in from Python), so this way dictionary-encoded streams are read as they always were."""

    def __init__(self, path: str, skip: list[Message]):
        self._map = pa.memory_map(path, "r")
        ranges, at = [], 0
        for m in sorted(skip, key=lambda m: m.start):
            ranges.append((at, m.start))
            at = m.end
        ranges.append((at, self._map.size()))
        self._ranges = [(a, b) for a, b in reversed(ranges) if b > a]  # the next one last
        self.closed = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> pa.Buffer | bytes:
        parts = []
        while self._ranges and n != 0:
            a, b = self._ranges.pop()
            k = b - a if n < 0 else min(n, b - a)
            self._map.seek(a)
            parts.append(self._map.read_buffer(k))
            if a + k < b:
                self._ranges.append((a + k, b))
            n = n - k if n > 0 else n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self.closed = True  # the map stays open: the batches read are slices of it
