"""Candidate pairs of the near-dedup step (data_prep/dedup/pairs.py): documents sharing a (band,
key) bucket pair with up to ``window`` documents before them in input order, each pair once,
smaller ref first; the largest similarity per document."""

import numpy as np

from data_prep.dedup.pairs import candidates, max_by_node


def test_candidates_within_a_bucket_and_a_window():
    band = np.array([0, 0, 0, 0, 1, 1, 0])
    key = np.array([7, 7, 7, 7, 7, 7, 9])
    ref = np.array([40, 10, 30, 20, 10, 20, 50])  # bucket (0, 7): 10, 20, 30, 40; (1, 7): 10, 20; (0, 9): 50 alone
    a, b = candidates(band, key, ref, window=2)
    # each with the two before it; (10, 20) found in both bands, listed once; 50 pairs with nothing
    assert list(zip(a.tolist(), b.tolist())) == [(10, 20), (10, 30), (20, 30), (20, 40), (30, 40)]
    a, b = candidates(band, key, ref, window=8)
    assert (10, 40) in set(zip(a.tolist(), b.tolist())) and len(a) == 6
    a, b = candidates(band[:0], key[:0], ref[:0], window=2)
    assert len(a) == len(b) == 0


def test_max_by_node():
    nodes, best = max_by_node(np.array([5, 3, 5, 3, 9]), np.array([0.8, 0.9, 0.95, 0.7, 0.85]))
    assert nodes.tolist() == [3, 5, 9] and best.tolist() == [0.9, 0.95, 0.85]
