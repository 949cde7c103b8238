"""Row sizes measured from Arrow buffers agree with what Python holds once the rows are decoded,
whatever the type, slice or sharing; a batch is planned in bounded slices."""

import numpy as np
import pyarrow as pa
import pytest

from data_prep.inputs import row_sizes
from data_prep.inputs.row_sizes import Over, head, held_bytes, is_blank, plan_batch, text_bytes

WORDS = ["héllo wörld", None, "", "市场 😀", "plain ascii text", None, "x" * 300]


def utf8(values):
    return [0 if v is None else len(v.encode()) for v in values]


@pytest.mark.parametrize(
    "arr",
    [
        pa.array(WORDS),
        pa.array(WORDS, pa.large_string()),
        pa.array(WORDS, pa.string_view()),
        pa.array([None if w is None else w.encode() for w in WORDS], pa.binary()),
        pa.array(WORDS).dictionary_encode(),
        pa.DictionaryArray.from_arrays(pa.array([6, None, 0, 6, 3, 2, 6], pa.int8()), pa.array(WORDS)),
    ],
    ids=["string", "large_string", "string_view", "binary", "dictionary", "dictionary-shared"],
)
def test_text_bytes_are_the_utf8_lengths_python_would_find_sliced_or_not(arr):
    for a in (arr, arr.slice(2, 4)):
        values = [v.decode() if isinstance(v, bytes) else v for v in a.to_pylist()]
        assert text_bytes(a).tolist() == utf8(values)
        assert (held_bytes(a) >= np.array(utf8(values))).all()


def nested_bomb(value: str, rows: int, refs: int) -> pa.Array:
    """A list column: each of ``rows`` rows holds ``refs`` references to one dictionary value."""
    inner = pa.DictionaryArray.from_arrays(pa.array([0] * rows * refs, pa.int32()), pa.array([value]))
    return pa.ListArray.from_arrays(pa.array(range(0, rows * refs + 1, refs), pa.int32()), inner)


def test_shared_and_nested_values_count_once_per_row_that_reaches_them():
    big = "b" * 10_000
    lists = nested_bomb(big, rows=3, refs=100)
    assert lists.nbytes < 12_000  # Arrow holds the value once ...
    assert (held_bytes(lists) >= 100 * 10_000).all()  # ... Python would hold it 100 times a row
    nulls = pa.ListArray.from_arrays(pa.array([0, 1_000_000], pa.int32()), pa.nulls(1_000_000))
    assert held_bytes(nulls)[0] >= 1_000_000 * 8  # a million Nones: 8 MB of list slots, no data
    runs = pa.RunEndEncodedArray.from_arrays([1, 4], pa.array(["a", big])).slice(1)
    assert (held_bytes(runs) >= 10_000).all() and len(held_bytes(runs)) == 3
    struct = pa.array([{"a": big, "b": [1, 2]}, None, {"a": "x", "b": None}]).slice(1)
    assert held_bytes(struct)[1] < held_bytes(pa.array([{"a": big, "b": None}]))[0]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(["ab", big, "c", "d"]), 2).slice(1)
    assert held_bytes(fixed)[0] < 1000 and len(fixed) == 1  # ["c", "d"]: the slice skips the big value
    mapped = pa.array([[("k", big)], []], pa.map_(pa.string(), pa.string()))
    assert held_bytes(mapped)[0] > 10_000 > held_bytes(mapped)[1]
    with pytest.raises(TypeError, match="cannot be measured"):
        held_bytes(pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array(["a"])]))


def test_a_batch_is_planned_in_bounded_slices_around_the_rows_over_the_limit(monkeypatch):
    monkeypatch.setattr(row_sizes, "SLICE_BYTES", 1000)
    text = pa.array(["a" * 300, "b" * 300, "c" * 5000, "d" * 300, "e" * 300, "f" * 300, " " * 5000])
    ids = pa.array(["1", "2", "3", "4", "i" * 6000, "6", "7"]).dictionary_encode()
    plan = plan_batch(pa.record_batch({"text": text, "id": ids}), "text", 4096)
    assert plan == [
        (0, 2),
        Over(2, frozenset({"text"})),
        (3, 4),
        Over(4, frozenset({"id"})),
        (5, 6),
        Over(6, frozenset({"text"})),
    ]
    assert head(text, 2, 4) == "cccc" and not is_blank(text, 2) and is_blank(text, 6)
    # an ordinary batch is one slice
    assert plan_batch(pa.record_batch({"text": text.slice(0, 2)}), "text", 4096) == [(0, 2)]
