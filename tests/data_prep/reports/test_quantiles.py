"""Exact quantiles over a stream: equal to numpy.quantile on the whole data, bit for bit."""

import numpy as np
import pytest

from data_prep.reports import quantiles as Q

QS = (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0)


def values(kind: str, n: int, rng) -> np.ndarray:
    if kind == "uniform":
        return rng.random(n)
    if kind == "ties":
        return np.round(rng.random(n), 2)
    if kind == "mostly zero":  # one value everywhere but a few: bins that never narrow by count
        return np.where(rng.random(n) < 0.01, rng.normal(size=n), 0.0)
    return rng.lognormal(size=n) * rng.choice([-1, 1], n)  # both signs, wide exponents


@pytest.mark.parametrize("kind", ["uniform", "ties", "mostly zero", "signed"])
def test_equal_to_numpy(kind, monkeypatch):
    monkeypatch.setattr(Q, "COLLECT", 64)  # force several narrowing passes on test-sized data
    rng = np.random.default_rng(len(kind))
    n = 50_000
    g = rng.integers(0, 4, n)
    v = values(kind, n, rng)
    passes = []

    def batches():
        passes.append(1)
        for s in range(0, n, 997):
            yield g[s : s + 997], v[s : s + 997]

    counts = {k: int((g == k).sum()) for k in range(5)}  # group 4 has no values
    got = Q.quantiles(batches, counts, QS)
    assert set(got) == {0, 1, 2, 3} and len(passes) >= 3
    for k in range(4):
        assert np.array_equal(np.array(got[k]), np.quantile(v[g == k], QS)), k
    before = len(passes)
    assert Q.quantiles(batches, counts, QS, held=(g, v)) == got and len(passes) == before  # held: no pass


def test_one_value_and_keys_round_trip():
    assert Q.quantiles(lambda: [(np.zeros(1, dtype=np.int64), np.array([0.25]))], {0: 1}, QS) == {0: [0.25] * len(QS)}
    x = np.array([-np.inf, -3.5, -0.0, 0.0, 1e-300, 2.0, np.inf])
    k = Q.to_key(x)
    assert np.all(np.diff(k.astype(object)) >= 0) and np.array_equal(Q.from_key(k), x + 0.0)
