"""Connected components by Large-/Small-Star: equal to a plain union-find, in memory and over
partitioned files, for any number of partitions."""

import numpy as np
import pytest

from data_prep.dedup.components import EDGE_SCHEMA, both_ways, components, run_stars
from data_prep.dedup.shuffle import read_routed, route, write_routed
from data_prep.storage.workdir import Paths


def reference(u, v) -> dict[int, int]:
    """Every non-smallest node → its component's smallest node, by union-find."""
    parent: dict[int, int] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(u.tolist(), v.tolist()):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in list(parent) if find(x) != x}


def graphs():
    rng = np.random.default_rng(7)
    chain = np.arange(1, 1001, dtype=np.int64)
    yield "chain of 1000, shuffled", *(lambda p: (chain[1:][p], chain[:-1][p]))(rng.permutation(999))
    yield "star, edges to the largest", np.arange(1, 50, dtype=np.int64), np.full(49, 50, dtype=np.int64)
    ring = np.arange(200, dtype=np.int64) * 7919 % 1009
    yield "ring", ring, np.roll(ring, 1)
    for s in range(5):
        n = int(rng.integers(20, 3000))
        m = int(rng.integers(1, 2 * n))
        refs = np.sort(rng.choice(1 << 40, size=n, replace=False)).astype(np.int64)
        a, b = refs[rng.integers(0, n, m)], refs[rng.integers(0, n, m)]
        keep = a != b
        yield f"random {s}", a[keep], b[keep]


@pytest.mark.parametrize("name,u,v", list(graphs()), ids=lambda x: x if isinstance(x, str) else "")
def test_in_memory_equals_union_find(name, u, v):
    c, r = components(np.maximum(u, v), np.minimum(u, v))
    assert dict(zip(c.tolist(), r.tolist())) == reference(u, v)


@pytest.mark.parametrize("n,one_task", [(1, False), (3, False), (8, False), (3, True)])
def test_partitioned_steps_equal_union_find(tmp_path, n, one_task):
    """The job's own steps over files: pairs files routed by node, rounds until a star forest (or
    the whole graph in one task, when it fits)."""
    rng = np.random.default_rng(n)
    refs = (rng.integers(0, 50, 4000).astype(np.int64) << 32) | rng.integers(0, 1 << 20, 4000)
    u, v = refs[rng.integers(0, 4000, 3000)], refs[rng.integers(0, 4000, 3000)]
    keep = u != v
    u, v = u[keep], v[keep]
    paths = Paths(tmp_path)
    # pairs files as find_pairs writes them: both ways, routed by the first node, split over n writers
    rows = [0] * n
    for w, idx in enumerate(np.array_split(np.arange(len(u)), n)):
        a, b = both_ways(np.maximum(u[idx], v[idx]), np.minimum(u[idx], v[idx]))
        m = write_routed(paths.dedup_file("pairs", w), EDGE_SCHEMA, {"u": a, "v": b}, route(a, n), n)
        rows = [x + y for x, y in zip(rows, m["rows"])]
    serial = lambda f, items: (f(x) for x in items)  # noqa: E731
    files, rounds = run_stars(
        serial, str(tmp_path), rows, memory_gib=2, sources=["pairs"], one_task_rows=sum(rows) if one_task else 0
    )
    got = {}
    for q in range(n):
        e = read_routed([tmp_path / f for f in files], q, EDGE_SCHEMA)
        child = e["u"] > e["v"]
        assert np.all(route(e["u"][child], n) == q)  # a node's label lives in its own partition
        got.update(zip(e["u"][child].tolist(), e["v"][child].tolist()))
    assert got == reference(u, v) and (rounds == 0 if one_task else rounds >= 2)
