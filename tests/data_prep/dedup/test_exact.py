"""The exact-dedup step's arithmetic (data_prep/dedup/exact.py): a ref packs (chunk, position) and
sorts as the input does; runs of one chunk's refs, chunk ranges and group starts."""

import numpy as np

from data_prep.dedup.exact import chunk_runs, groups_of, range_of, refs_of


def test_refs_order_documents_as_the_input_does():
    refs = np.concatenate([refs_of(3, np.array([0, 7])), refs_of(1, np.array([2**31 + 5])), refs_of(3, np.array([2]))])
    assert [(int(r >> 32), int(r & 0xFFFFFFFF)) for r in np.sort(refs)] == [(1, 2**31 + 5), (3, 0), (3, 2), (3, 7)]
    assert chunk_runs(np.sort(refs)) == [(1, 0, 1), (3, 1, 4)]
    assert chunk_runs(np.array([], dtype=np.int64)) == []


def test_ranges_and_group_starts():
    # ranges start at chunks 0, 4 and 9
    assert range_of(np.array([0, 3, 4, 8, 9, 12]), np.array([0, 4, 9])).tolist() == [0, 0, 1, 1, 2, 2]
    a = np.array([1, 1, 2, 2, 2, 5])
    b = np.array([0, 0, 0, 1, 1, 1])
    assert groups_of(a).tolist() == [True, False, True, False, False, True]
    assert groups_of(a, b).tolist() == [True, False, True, True, False, True]  # either key changes
    assert groups_of(np.array([], dtype=np.int64)).tolist() == []
