"""The trainer's access to prepared data (contract 1, ``data_prep/FORMAT.md``): shards read in
place, checksums verified once per run, samples collated into padded tensors.

Why it scales with the data and the rank count:

* **Zero-copy rows.** A shard is an Arrow IPC stream of record batches. It is memory-mapped, on
  first use, and each batch's list columns are kept as numpy *views* of the mapped file's
  buffers, so no token is copied onto a rank's heap; the rows a step touches come in through the
  page cache, which all ranks of a node share. Nothing per row is held in memory: a (language,
  bucket) stream is its shards' row counts (from the manifest), and lengths are read for the
  drawn samples only.
* **Checksums once per run** (:func:`verify_once`): the shards to hash are split over all ranks,
  their findings gathered, and a stamp (``RUN_DIR/data_verified.json``: manifest hash and each
  shard's size and mtime) written; a later start of the same run hashes only shards whose size or
  mtime changed since. A corrupt shard is refused on every rank before the first step, with an
  error naming it. This assumes what multi-node training usually has: one copy of the data, on a
  filesystem every node sees. With a private copy per node, only the shards a node's ranks
  hashed are verified on that node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bloomline.errors import DataError
from bloomline.io import write_json_atomic
from data_prep.storage.data_cache import prepared, source_of
from data_prep.storage.shards import (
    CorruptShardError,
    checksum_error,
    load_manifest,
    manifest_sha256,
    pad_id,
    read_shard,
    shard_file,
)
from training.model.bloom import IGNORE_INDEX
from training.planning.flops import document_pairs

SampleRef = tuple[int, int]
"""``(shard_id, row)``: shard_id indexes :attr:`ShardIndex.shards`."""


class ShardRows:
    """One shard's rows, read in place from its memory-mapped file, opened on first use.

    Opening late matters as much as not copying: the kernel maps the pages around any page a
    process touches (fault-around, 64 KiB by default), so opening every shard at start would put
    a slice of every file into every rank's RSS; a rank opens only the shards its batches draw."""

    def __init__(self, path: Path, rows: int):
        self.path, self.rows = path, rows
        self._cols: list[tuple[np.ndarray, ...]] | None = None
        self._starts = np.zeros(1, dtype=np.int64)

    def _open(self) -> list[tuple[np.ndarray, ...]]:
        if self._cols is not None:
            return self._cols
        batches = read_shard(self.path, self.rows)  # the schema and format version checked there
        # per batch (ids offsets, ids values, doc_offsets offsets, doc_offsets values): numpy views
        # of the list columns' buffers (a list array's buffers: validity, offsets, child validity,
        # child values), so nothing is copied
        cols = [
            tuple(
                np.frombuffer(buf, dtype=np.int32)
                for c in ("input_ids", "doc_offsets")
                for buf in b.column(c).buffers()[1::2]
            )
            for b in batches
        ]
        self._cols, self._starts = cols, np.cumsum([0] + [b.num_rows for b in batches])
        return cols

    def fetch(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32, unpadded) and doc_offsets of one sample (views of the mapped file)."""
        cols = self._open()
        k = int(np.searchsorted(self._starts, row, side="right")) - 1
        r = row - int(self._starts[k])
        io, iv, oo, ov = cols[k]
        return iv[io[r] : io[r + 1]], ov[oo[r] : oo[r + 1]]

    def lengths(self, rows: np.ndarray) -> np.ndarray:
        """Lengths (int64) of the given rows."""
        cols = self._open()
        ks = np.searchsorted(self._starts, rows, side="right") - 1
        out = np.empty(len(rows), dtype=np.int64)
        for k in np.unique(ks):
            sel = ks == k
            r = rows[sel] - self._starts[k]
            io = cols[k][0]
            out[sel] = io[r + 1] - io[r]
        return out

    def pairs(self, rows: np.ndarray) -> np.ndarray:
        """(query, key) pairs the document-causal mask admits (training.planning.flops.document_pairs), per row."""
        out = np.empty(len(rows), dtype=np.int64)
        for i, row in enumerate(rows.tolist()):
            toks, offsets = self.fetch(row)
            out[i] = document_pairs(offsets, len(toks))
        return out


@dataclass
class Stream:
    """All samples of one (language, bucket) in one split: its shards in manifest order.
    Sample ``i`` of the stream is row ``i - starts[j]`` of shard ``shard_ids[j]``."""

    lang: str
    bucket: int
    shard_ids: np.ndarray  # int64 [k]
    starts: np.ndarray  # int64 [k + 1], cumulative rows
    tokens: int

    @property
    def key(self) -> str:
        return f"{self.lang}/{self.bucket}"

    @property
    def size(self) -> int:
        return int(self.starts[-1])

    def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard ids, rows) of stream samples ``idx``."""
        j = np.searchsorted(self.starts, idx, side="right") - 1
        return self.shard_ids[j], idx - self.starts[j]


class ShardIndex:
    """The shards of one split of a prepared data folder, opened in place.

    Opening reads the manifest only: each shard is opened when a batch first draws from it, it is
    hashed by :func:`verify_once` (once per run), and no row is copied.
    """

    def __init__(self, data_dir: str | Path, split: str = "train"):
        self.data_dir = prepared(data_dir)  # data at a URL: its copy in this node's cache
        self.cached = source_of(self.data_dir) != str(self.data_dir)
        self.split = split
        self.manifest = load_manifest(self.data_dir)
        self.shards = [s for s in self.manifest["shards"] if s["split"] == split]
        if not self.shards:
            raise DataError(f"{self.data_dir}: the manifest lists no '{split}' shards")
        self.rows = [ShardRows(shard_file(self.data_dir, s), int(s["rows"])) for s in self.shards]
        missing = [] if self.cached else [str(r.path) for r in self.rows if not r.path.is_file()]
        if missing:
            raise CorruptShardError(
                f"shard missing: {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        parts: dict[tuple[str, int], list[int]] = {}
        for sid, s in enumerate(self.shards):
            parts.setdefault((s["lang"], int(s["bucket"])), []).append(sid)
        self.streams: dict[tuple[str, int], Stream] = {}
        for (lang, bucket), sids in sorted(parts.items()):
            self.streams[(lang, bucket)] = Stream(
                lang,
                bucket,
                shard_ids=np.array(sids, dtype=np.int64),
                starts=np.cumsum([0] + [int(self.shards[i]["rows"]) for i in sids]),
                tokens=sum(int(self.shards[i]["tokens"]) for i in sids),
            )
        self.languages = sorted({lang for lang, _ in self.streams})
        self.buckets = sorted({b for _, b in self.streams})
        self.pad_id = pad_id(self.manifest["tokenizer"])

    def fetch_all(self) -> None:
        """Open every shard of the split now (data at a URL: each fetched into this node's cache
        and checked), for processes that read them from the cache but did not open it."""
        for r in self.rows:
            r._open()

    def lang_tokens(self, lang: str) -> int:
        """Real (unpadded) tokens of ``lang`` in this split."""
        return sum(s.tokens for (lg, _), s in self.streams.items() if lg == lang)

    def fetch(self, shard_id: int, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32, unpadded) and doc_offsets of one sample."""
        return self.rows[shard_id].fetch(row)

    def lengths(self, shard_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Lengths (int64) of samples ``(shard_ids[i], rows[i])``."""
        return self._per_shard(shard_ids, rows, ShardRows.lengths)

    def pairs(self, shard_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Admitted attention pairs Σ dᵢ(dᵢ+1)/2 (int64) of samples ``(shard_ids[i], rows[i])``."""
        return self._per_shard(shard_ids, rows, ShardRows.pairs)

    def _per_shard(
        self, shard_ids: np.ndarray, rows: np.ndarray, fn: Callable[[ShardRows, np.ndarray], np.ndarray]
    ) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.int64)
        for sid in np.unique(shard_ids):
            sel = shard_ids == sid
            out[sel] = fn(self.rows[int(sid)], rows[sel])
        return out


# --------------------------------------------------------------------------- checksums, once per run


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _read_stamp(stamp: Path, manifest_sha: str) -> dict[str, Any]:
    """The shards a run's stamp lists as verified, for this manifest ({} when none)."""
    try:
        old = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}  # no stamp yet, or a damaged one: hash again
    return old.get("shards", {}) if old.get("manifest_sha256") == manifest_sha else {}


def verify_once(
    index: ShardIndex,
    stamp: str | Path,
    rank: int = 0,
    world: int = 1,
    broadcast: Callable[[Any], Any] = lambda x: x,
    gather: Callable[[Any], list[Any]] = lambda x: [x],
) -> int:
    """Check the sha256 of every shard of the split not yet verified for this run, the work split
    over the ``world`` ranks; returns how many shards this rank hashed.

    ``broadcast(obj)`` returns rank 0's ``obj`` on every rank and ``gather(obj)`` every rank's
    ``obj`` (torch.distributed's object collectives, see :func:`torch_collectives`; identities
    for one process). Rank 0 decides what to hash from the stamp, so every rank hashes its share
    of the same list; it writes the stamp once every shard passed. Raises CorruptShardError (on
    every rank) naming the first corrupt shard, so no rank starts training on bad data.
    """
    if index.cached:  # each shard is checked as it is fetched into the cache (data_prep/storage/data_cache.py)
        return 0
    stamp = Path(stamp)
    manifest_sha = manifest_sha256(index.data_dir)
    todo: list[int] | None = None
    if rank == 0:
        seen = _read_stamp(stamp, manifest_sha)
        now = {s["path"]: [*_stat(index.rows[i].path), s["sha256"]] for i, s in enumerate(index.shards)}
        todo = [i for i, s in enumerate(index.shards) if seen.get(s["path"]) != now[s["path"]]]
    todo = broadcast(todo)
    mine = todo[rank::world]
    bad = [(i, e) for i in mine if (e := checksum_error(index.rows[i].path, index.shards[i]["sha256"]))]
    found = sorted(b for part in gather(bad) for b in part)
    if found:
        more = f" ({len(found) - 1} more corrupt shard(s) in {index.data_dir})" if len(found) > 1 else ""
        raise CorruptShardError(found[0][1] + more)
    if rank == 0 and todo:
        write_json_atomic(stamp, {"manifest_sha256": manifest_sha, "shards": {**seen, **now}})
    return len(mine)


def torch_collectives() -> tuple[Callable[[Any], Any], Callable[[Any], list[Any]]]:
    """(broadcast from rank 0, all-gather) of Python objects over torch.distributed's default group."""
    dist = torch.distributed

    def broadcast(obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    return broadcast, gather


# ------------------------------------------------------------------------------------- collation


def collate(index: ShardIndex, micro_batch: Sequence[SampleRef], bucket: int, pad: int) -> dict[str, torch.Tensor]:
    """Tensors of one micro-batch, padded to ``bucket``.

    * ``input_ids`` LongTensor[m, bucket]: the sample's tokens, then ``pad``.
    * ``labels``: ``input_ids`` shifted left by one; IGNORE_INDEX (skipped by the loss) on
      padding, at each sample's last real position (its next token is not in the sample) and at
      every position whose next token starts another document — so the model is never trained to
      predict one document from another that was merely packed before it.
    * ``segment_ids``: 1, 2, 3, … per document from ``doc_offsets``, 0 on padding (for an
      attention mask that stays inside a document).
    * ``lengths`` LongTensor[m]: real lengths.
    """
    m = len(micro_batch)
    ids = np.full((m, bucket), pad, dtype=np.int64)
    labels = np.full((m, bucket), IGNORE_INDEX, dtype=np.int64)
    seg = np.zeros((m, bucket), dtype=np.int64)
    lengths = np.zeros(m, dtype=np.int64)
    for i, (shard_id, row) in enumerate(micro_batch):
        toks, offsets = index.fetch(shard_id, row)
        n = len(toks)
        if n > bucket:
            raise DataError(
                f"sample {index.shards[shard_id]['path']}:{row} has {n} tokens, more than its bucket {bucket}"
            )
        ids[i, :n] = toks
        lengths[i] = n
        labels[i, : n - 1] = toks[1:]
        starts = np.asarray(offsets, dtype=np.int64)
        labels[i, starts[starts > 0] - 1] = IGNORE_INDEX
        seg[i, :n] = np.searchsorted(starts, np.arange(n), side="right")
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "segment_ids": torch.from_numpy(seg),
        "lengths": torch.from_numpy(lengths),
    }
