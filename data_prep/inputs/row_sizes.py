"""How much each row of an Arrow batch holds once decoded, found from its buffers before any Python
object exists, and the plan that reads a batch a bounded slice at a time.

A column can hold far more than its file: a dictionary-encoded column stores each distinct value
once, so 1,024 rows may point at one 8 MiB string, and ``to_pylist`` of one batch of a 1 KB
Parquet file makes 8 GiB of Python strings (issue 37). The file's metadata, all that the memory
budget (data_prep/passes/budget.py) sees before work starts, counts the value once. So each row is
measured where it lies: a dictionary's value lengths are taken through its indices, a list's
child sizes summed through its offsets, a run-end encoded array's through its runs. Then
:func:`plan_batch` cuts a batch into slices whose rows hold at most :data:`SLICE_BYTES` together,
and names the rows with a field over ``read.max_doc_bytes``: data_prep/inputs/table_reader.py books
those without decoding the field (:func:`head` and :func:`is_blank` give it what it needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SLICE_BYTES = 64 << 20
"""At most this many bytes of a batch's rows are Python objects at once (a row larger than this
alone is a slice of its own; each of its fields is within ``read.max_doc_bytes``)."""

PY_VALUE_BYTES = 64
"""What a Python value costs beside its data (an object header, a list slot), counted for every
value, nested ones too: a list of a million nulls takes a few bytes in Arrow and 8 MB in Python."""

_STRING = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BINARY = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_map, pa.types.is_list_view, pa.types.is_large_list_view)


def _valid(arr: pa.Array) -> np.ndarray:
    return arr.is_valid().to_numpy(zero_copy_only=False)


def is_text(t: pa.DataType) -> bool:
    """Whether values of type ``t`` become ``str`` in Python (a dictionary of strings too)."""
    t = t.value_type if pa.types.is_dictionary(t) else t
    return any(f(t) for f in _STRING)


def _through(values: np.ndarray, arr: pa.Array) -> np.ndarray:
    """Per row of dictionary array ``arr``: the size of the value its index points at (0: null)."""
    idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
    if len(idx) and (idx.min() < 0 or idx.max() >= max(len(values), 1)):
        raise ValueError("a dictionary index out of range")
    picked = values[idx] if len(values) else np.zeros(len(idx), values.dtype)
    return np.where(_valid(arr), picked, 0)


def text_bytes(arr: pa.Array) -> np.ndarray:
    """The UTF-8 (or raw) bytes of each value of a string or binary array, what
    ``len(value.encode())`` would give, without decoding a value; 0 for a null."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _through(text_bytes(arr.dictionary), arr)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        # each view is 16 bytes, its first 4 the value's length (binary_length has no view kernel)
        views = np.frombuffer(arr.buffers()[1], np.int32).reshape(-1, 4)
        return np.where(_valid(arr), views[arr.offset : arr.offset + len(arr), 0], 0).astype(np.int64)
    return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _width(t: pa.DataType) -> int | None:
    """Bytes of one value of a fixed-width type (numbers, booleans, dates, times, decimals)."""
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # not fixed-width
        return None


def _per_value(t: pa.DataType) -> float | None:
    """What every value of ``t`` holds, when that is the same for all (no array is made for a
    list of a billion nulls)."""
    if pa.types.is_null(t):
        return float(PY_VALUE_BYTES)
    width = None if pa.types.is_union(t) or pa.types.is_dictionary(t) else _width(t)
    return None if width is None else float(width + PY_VALUE_BYTES)


def held_bytes(arr: pa.Array) -> np.ndarray:
    """About how many bytes each row of ``arr`` holds once it is a Python object (float64): its
    values' data plus :data:`PY_VALUE_BYTES` for each value, nested ones included. Shared data
    counts once per row that reaches it, as Python holds it (a dictionary value, a run). A type
    this cannot measure (a union) raises TypeError."""
    t = arr.type
    n = len(arr)
    if isinstance(t, pa.ExtensionType):
        return held_bytes(arr.storage)
    if (each := _per_value(t)) is not None:
        return np.full(n, each)
    if pa.types.is_dictionary(t):
        return _through(held_bytes(arr.dictionary), arr)
    if pa.types.is_run_end_encoded(t):
        runs = np.searchsorted(arr.run_ends.to_numpy(zero_copy_only=False), arr.offset + np.arange(n), side="right")
        return held_bytes(arr.values)[runs]
    if any(f(t) for f in _STRING + _BINARY):
        data = text_bytes(arr).astype(np.float64)
    elif pa.types.is_fixed_size_binary(t):
        data = np.full(n, float(t.byte_width))
    elif any(f(t) for f in _LISTS):
        starts = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
            ends = starts + arr.sizes.fill_null(0).to_numpy(zero_copy_only=False)
        else:
            starts, ends = starts[:-1], starts[1:]
        if (each := _per_value(arr.values.type)) is not None:
            data = (ends - starts) * each
        else:  # sums over the child's values, through the offsets (list arrays index their whole child)
            child = np.concatenate(([0.0], np.cumsum(held_bytes(arr.values))))
            data = child[ends] - child[starts]
    elif pa.types.is_fixed_size_list(t):
        k = t.list_size
        child = held_bytes(arr.values.slice(arr.offset * k, n * k))
        data = child.reshape(n, k).sum(axis=1) if k else np.zeros(n)
    elif pa.types.is_struct(t):
        data = sum((held_bytes(f) for f in arr.flatten()), np.zeros(n))
    else:
        raise TypeError(f"a {t} column is not read (its size cannot be measured)")
    return np.where(_valid(arr), data, 0.0) + PY_VALUE_BYTES


@dataclass(frozen=True)
class Over:
    """A row of a batch with fields over ``read.max_doc_bytes``: read without decoding them."""

    row: int
    fields: frozenset[str]


def plan_batch(batch: pa.RecordBatch, text_field: str, limit: int) -> list[tuple[int, int] | Over]:
    """The rows of ``batch`` in order, as slices ``(start, stop)`` to decode, each holding at most
    :data:`SLICE_BYTES` (or one row), and the rows to read as :class:`Over`: a text over
    ``limit`` UTF-8 bytes (what ``len(text.encode())`` would say), or any other field that would
    hold more than ``limit`` bytes decoded."""
    n = batch.num_rows
    total = np.zeros(n)
    over: dict[str, np.ndarray] = {}
    for name, col in zip(batch.schema.names, batch.columns):
        held = held_bytes(col)
        total += held
        over[name] = (text_bytes(col) if name == text_field and is_text(col.type) else held) > limit
    any_over = np.zeros(n, bool)
    for o in over.values():
        any_over |= o
    if not any_over.any() and total.sum() <= SLICE_BYTES:  # the common case: the batch in one piece
        return [(0, n)] if n else []
    plan: list[tuple[int, int] | Over] = []
    start, size = 0, 0.0
    for k in range(n):
        if any_over[k]:
            if start < k:
                plan.append((start, k))
            plan.append(Over(k, frozenset(name for name, o in over.items() if o[k])))
            start, size = k + 1, 0.0
            continue
        if size and size + total[k] > SLICE_BYTES:
            plan.append((start, k))
            start, size = k, 0.0
        size += total[k]
    if start < n:
        plan.append((start, n))
    return plan


def _one_text(arr: pa.Array, row: int) -> pa.Array:
    """Row ``row`` of a text array as a one-value array pyarrow's string kernels take (the
    dictionary's value itself; a view's value copied, the only copy made)."""
    if pa.types.is_dictionary(arr.type):
        return _one_text(arr.dictionary, arr.indices[row].as_py())
    one = arr.slice(row, 1)
    return one.cast(pa.large_string()) if pa.types.is_string_view(arr.type) else one


def head(arr: pa.Array, row: int, chars: int) -> str:
    """The first ``chars`` characters of text value ``row`` of ``arr``, the rest left undecoded."""
    return pc.utf8_slice_codeunits(_one_text(arr, row), 0, chars)[0].as_py()


def is_blank(arr: pa.Array, row: int) -> bool:
    """Whether non-empty text value ``row`` is all whitespace, as ``not text.strip()`` would say
    (Arrow's Unicode whitespace is Python's: every code point was compared), without decoding it."""
    return bool(pc.utf8_is_space(_one_text(arr, row))[0].as_py())
