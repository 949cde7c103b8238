"""Contract 1: Arrow shards + ``manifest.json`` (see ``data_prep/FORMAT.md``).

Shards are Arrow IPC *stream* files — the format ``datasets.Dataset.from_file`` memory-maps —
so plain pyarrow (``pa.ipc.open_stream``) and ``datasets`` read them without bloomline.
One shard holds samples of one split, one language and one bucket.

:func:`load_manifest` checks the manifest's format version and fields; :func:`read_shard`, the
one reader of a shard, checks its schema, format version and rows, and :func:`checksum_error` its
sha256 against the manifest; both name the file when it does not match.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bloomline.errors import DataError
from bloomline.io import publish, read_contract_json, sha256_file, tmp_path
from bloomline.names import checked_name, confined
from bloomline.storage import join
from data_prep.storage.data_cache import fetched_shard, prepared, source_of

FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)
"""Version 2 added the tokenizer's ``kind`` (a Hugging Face ``tokenizer.json`` besides SentencePiece)
and ``extends``; a version-1 folder is read as SentencePiece's, its shards being the same columns."""

SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("lang", pa.string(), nullable=False),
        pa.field("doc_offsets", pa.list_(pa.int32()), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
    ]
)

ROWS_PER_BATCH = 1024

MANIFEST_KEYS = ("format_version", "tokenizer", "buckets", "shards", "blend", "languages")
SHARD_KEYS = ("path", "split", "bucket", "lang", "rows", "tokens", "sha256")


class CorruptShardError(DataError):
    pass


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


class ShardWriter:
    """Streams samples (objects with ``.ids`` and ``.doc_offsets``) into one shard file.

    The file appears under its final name only at :meth:`close` (atomic rename), so a reader or
    a resumed run never sees a partial shard.
    """

    def __init__(self, path: Path, lang: str, bucket: int, split: str):
        self.path = Path(path)
        self.lang, self.bucket, self.split = lang, bucket, split
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tmp_path(self.path)
        self.schema = SCHEMA.with_metadata(
            {"bloomline.format_version": str(FORMAT_VERSION), "bucket": str(bucket), "split": split, "lang": lang}
        )
        self._sink = pa.OSFile(str(self._tmp), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self._batch: list[Any] = []
        self.rows = self.tokens = 0

    def add(self, sample: Any) -> None:
        if len(sample.ids) > self.bucket:
            raise ValueError(f"sample of {len(sample.ids)} tokens does not fit bucket {self.bucket}")
        self._batch.append(sample)
        self.rows += 1
        self.tokens += len(sample.ids)
        if len(self._batch) == ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        b = self._batch
        # Build the list columns from flat buffers + offsets: one copy, no per-row conversion.
        lens = np.fromiter((len(x.ids) for x in b), dtype=np.int32, count=len(b))
        ids = pa.ListArray.from_arrays(
            pa.array(_offsets(lens)), pa.array(np.concatenate([x.ids for x in b]), pa.int32())
        )
        n_offs = np.fromiter((len(x.doc_offsets) for x in b), dtype=np.int32, count=len(b))
        flat = np.fromiter((o for x in b for o in x.doc_offsets), dtype=np.int32, count=int(n_offs.sum()))
        offs = pa.ListArray.from_arrays(pa.array(_offsets(n_offs)), pa.array(flat, pa.int32()))
        langs = pa.array([self.lang] * len(b), type=pa.string())
        self._writer.write_batch(pa.record_batch([ids, langs, offs, pa.array(lens, pa.int32())], schema=self.schema))
        self._batch = []

    def close(self) -> dict[str, Any]:
        """Finish the file, move it into place; return rows, tokens and sha256."""
        if self._batch:
            self._flush()
        self._writer.close()
        self._sink.close()
        with open(self._tmp, "rb") as f:
            os.fsync(f.fileno())
        publish(self._tmp, self.path)
        return {"rows": self.rows, "tokens": self.tokens, "sha256": sha256_file(self.path)}

    def abort(self) -> None:
        try:
            self._writer.close()
            self._sink.close()
        finally:
            self._tmp.unlink(missing_ok=True)


MANIFEST = "manifest.json"


def manifest_path(data_dir: str | Path) -> Path:
    """``DATA_DIR/manifest.json``: its presence means the data is complete (FORMAT.md). For data at
    a URL, this node's copy of it (data_prep/storage/data_cache.py)."""
    return prepared(data_dir) / MANIFEST


def manifest_sha256(data_dir: str | Path) -> str:
    """The data's identity: the sha256 of its manifest, which holds every shard's sha256."""
    return sha256_file(manifest_path(data_dir))


def load_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Read and check ``DATA_DIR/manifest.json``."""
    path = manifest_path(data_dir)
    m = read_contract_json(path, DataError, f"is {data_dir} the --out folder of a finished 'bloomline prepare'?")
    missing = [k for k in MANIFEST_KEYS if k not in m]
    if missing:
        raise DataError(f"{path}: missing keys {missing}")
    if m["format_version"] not in READS_VERSIONS:
        raise DataError(f"{path}: format_version {m['format_version']}, this bloomline reads {READS_VERSIONS}")
    m["tokenizer"].setdefault("kind", "sentencepiece")
    source = _source(data_dir)
    for i, s in enumerate(m["shards"]):
        miss = [k for k in SHARD_KEYS if k not in s]
        if miss:
            raise DataError(f"{path}: shards[{i}] lacks {miss}")
        checked_name(s["path"], source)  # someone else's folder: its names stay inside it
    checked_name(m["tokenizer"].get("path"), source)
    return m


def _source(data_dir: str | Path) -> str:
    """Where a manifest's names come from, as a refusal names it: the folder's own URL for data at one."""
    return join(source_of(prepared(data_dir)), MANIFEST)


def shard_file(data_dir: str | Path, shard: dict[str, Any]) -> Path:
    """The file of manifest entry ``shard`` in ``data_dir``, confined to it (bloomline/names.py)."""
    return confined(prepared(data_dir), shard["path"], _source(data_dir))


def tokenizer_file(data_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """The tokenizer file the manifest names in ``data_dir``, confined to it (bloomline/names.py)."""
    return confined(prepared(data_dir), manifest["tokenizer"]["path"], _source(data_dir))


def checksum_error(path: Path, sha256: str) -> str | None:
    """Why the file at ``path`` is not the shard the manifest lists (its sha256), or None."""
    digest = sha256_file(path)
    if digest == sha256:
        return None
    return f"shard {path} is corrupt: sha256 {digest[:12]}… does not match the manifest's {sha256[:12]}…"


def read_shard(path: str | Path, rows: int) -> list[pa.RecordBatch]:
    """The one reader of a shard file: its record batches, memory-mapped (nothing is copied),
    after checking the schema, the ``bloomline.format_version`` it was written with and the row
    count the manifest gives. CorruptShardError naming the file otherwise."""
    path = fetched_shard(Path(path), CorruptShardError)  # data at a URL: fetched into this node's cache, checked
    if not path.is_file():
        raise CorruptShardError(f"shard missing: {path}")
    try:
        source = pa.memory_map(str(path), "r")
        for message in pa.ipc.MessageReader.open_stream(source):  # metadata only: bodies stay mapped
            if _body_compressed(message.metadata.to_pybytes()):
                raise CorruptShardError(
                    f"shard {path} holds compressed record batches, which bloomline never writes: refused "
                    f"before decoding (a few KiB can decode to GiB); prepare the data again"
                )
        source.seek(0)
        reader = pa.ipc.open_stream(source)
        schema = reader.schema
        version = (schema.metadata or {}).get(b"bloomline.format_version", b"").decode()
        if version not in {str(v) for v in READS_VERSIONS}:
            raise CorruptShardError(
                f"shard {path}: written with shard format {version or 'unknown'}, "
                f"this bloomline reads {READS_VERSIONS}: prepare the data again"
            )
        if not schema.remove_metadata().equals(SCHEMA):
            raise CorruptShardError(f"shard {path}: its columns are not contract 1's (data_prep/FORMAT.md): {schema}")
        batches = list(reader)
    except pa.ArrowInvalid as e:
        raise CorruptShardError(f"shard {path} is unreadable: {e}") from None
    n = sum(b.num_rows for b in batches)
    if n != rows:
        raise CorruptShardError(f"shard {path}: {n} rows, the manifest says {rows}")
    return batches


def _body_compressed(meta: bytes) -> bool:
    """Whether an Arrow IPC message (its flatbuffer ``meta``) is a record or dictionary batch with
    a body compression set (Arrow's format/Message.fbs: ``Message.header`` is union field 1/2,
    ``RecordBatch.compression`` field 3, ``DictionaryBatch.data`` field 1). pyarrow decodes such a
    body whole as it reads it and exposes no flag before that, so the flatbuffer is read here."""
    import struct

    def field(table: int, i: int) -> int | None:
        vtable = table - struct.unpack_from("<i", meta, table)[0]
        if 4 + 2 * i >= struct.unpack_from("<H", meta, vtable)[0]:
            return None
        off = struct.unpack_from("<H", meta, vtable + 4 + 2 * i)[0]
        return table + off if off else None

    def deref(pos: int) -> int:
        return pos + struct.unpack_from("<I", meta, pos)[0]

    try:
        root = deref(0)
        kind_at, header_at = field(root, 1), field(root, 2)
        kind = meta[kind_at] if kind_at is not None else 0
        if kind not in (2, 3) or header_at is None:  # 2: DictionaryBatch, 3: RecordBatch
            return False
        batch = deref(header_at)
        if kind == 2:
            data_at = field(batch, 1)
            if data_at is None:
                return False
            batch = deref(data_at)
        return field(batch, 3) is not None
    except (struct.error, IndexError):
        return True  # metadata that does not parse is not ours: refused as compressed would be


def check_model_fits(manifest: dict[str, Any], data_dir: str | Path, vocab_size: int, seq_len: int) -> None:
    """The one data↔model compatibility check: the model's ``vocab_size`` is the tokenizer's
    (before padding; BLOOM: 250,680 — the padded table size is the model's own business) and
    the data's largest bucket fits its ``seq_len``. ConfigError naming the model key to change."""
    from bloomline.errors import ConfigError

    vocab = int(manifest["tokenizer"]["vocab_size"])
    if vocab != vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"the model's vocabulary is {vocab_size} but the data in {data_dir} was "
            f"tokenized with a {vocab}-piece tokenizer: set model.vocab_size={vocab} "
            "(the tokenizer's size before padding) or prepare the data with the "
            "model's tokenizer",
        )
    largest = max(int(b) for b in manifest["buckets"])
    if largest > seq_len:
        raise ConfigError(
            "model.seq_len",
            f"the data's largest bucket is {largest} tokens, longer than the model's "
            f"seq_len {seq_len}: raise model.seq_len or prepare the data with "
            f"pack.buckets up to {seq_len}",
        )


def pad_id(tokenizer: dict[str, Any]) -> int:
    """The id to pad samples with: ``<pad>``, or ``</s>`` for a reused tokenizer without one (id
    -1). Padded positions carry no label and are masked out of attention, so the id only has to
    be a valid row of the embedding."""
    pad = int(tokenizer.get("pad_id", -1))
    return pad if pad >= 0 else int(tokenizer["eos_id"])
