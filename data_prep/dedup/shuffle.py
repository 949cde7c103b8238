"""Routed files: how the dedup job's tasks hand rows to the next step through the disk.

A task writes its output rows as one Arrow IPC file with exactly ``n`` record batches, batch i
holding the rows routed to partition i of the next step, then a JSON marker of the same name
with the row count of every batch (and whatever the task reports). Task i of the next step reads
batch i of every upstream file: random access in the IPC file format, so it reads its rows only.
Files are written under a temporary name and renamed (the marker last), so a killed task leaves
nothing a rerun would take for done. With the run's folder at a URL, each file and marker is
read as the store has it (bloomline/mirror.py ``fetched``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from bloomline.io import publish, read_json, tmp_path, write_json_atomic
from bloomline.mirror import fetched
from data_prep.steps.minhash import mix64


def route(x: np.ndarray, n: int) -> np.ndarray:
    """Partition (0..n-1) of each 64-bit value, mixed first so that structured values (refs that
    count up within a chunk) spread evenly."""
    return (mix64(x.view(np.uint64) if x.dtype == np.int64 else x) % np.uint64(n)).astype(np.int64)


def marker(path: Path) -> Path:
    return path.with_suffix(".json")


def done(path: Path) -> dict[str, Any] | None:
    """The marker of a finished file, or None."""
    m = fetched(marker(path))
    return read_json(m) if m.exists() else None


def write_routed(
    path: Path,
    schema: pa.Schema,
    columns: dict[str, np.ndarray],
    part: np.ndarray,
    n: int,
    report: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``columns`` (equal-length arrays) as ``n`` batches by ``part``; rows keep their order
    within a batch. Returns the marker: ``{"rows": [count per batch], **report}``."""
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=n) if len(part) else np.zeros(n, dtype=np.int64)
    cols = {k: v[order] for k, v in columns.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
        start = 0
        for c in counts.tolist():
            w.write_batch(
                pa.record_batch([pa.array(cols[f.name][start : start + c], type=f.type) for f in schema], schema=schema)
            )
            start += c
    publish(tmp, path)
    m = {"rows": counts.tolist(), **(report or {})}
    write_json_atomic(marker(path), m, durable=False)
    return m


def read_routed(files: Iterable[Path], i: int, schema: pa.Schema) -> dict[str, np.ndarray]:
    """Batch ``i`` of every file, concatenated in the order of ``files``, as numpy arrays."""
    parts: dict[str, list[np.ndarray]] = {f.name: [] for f in schema}
    for path in files:
        with pa.memory_map(str(fetched(path)), "r") as src:
            b = pa.ipc.open_file(src).get_batch(i)
            for f in schema:
                parts[f.name].append(np.array(b.column(f.name).to_numpy(zero_copy_only=False)))
    return {
        k: (np.concatenate(v) if v else np.empty(0, dtype=schema.field(k).type.to_pandas_dtype()))
        for k, v in parts.items()
    }


def rows_for(files: Iterable[Path], i: int) -> int:
    """Rows that batch ``i`` of ``files`` hold together, from their markers (nothing is read)."""
    return sum(read_json(fetched(marker(p)))["rows"][i] for p in files)
