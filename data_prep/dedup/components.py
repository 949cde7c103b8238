"""Dedup step 5: connected components of the duplicate graph, labelled by their smallest node, in bounded memory.

The graph's nodes are document refs (input order), its edges the confirmed duplicate pairs. The
algorithm is Kiveris et al.'s alternating Large-Star / Small-Star ("Connected Components in
MapReduce and Beyond", SoCC 2014; BigCode's near-deduplication runs it on Spark). Edges are kept
oriented child → parent with parent < child:

* Large-Star, per node u with neighbours Γ(u): m = min(Γ(u) ∪ {u}); every larger neighbour v
  gets the edge v → m.
* Small-Star, per node u with smaller neighbours N: m = min(N); every v in N other than m gets
  v → m, and u gets u → m.

Both keep the components and shrink their depth; when a round changes nothing, every component is
a star around its smallest node, which is the document kept. The result is a function of the
graph alone: the same for any order of edges, any number of partitions and any number of
workers — unlike a union-find whose tasks race for a shared structure (datatrove's fast_mh3
keeps a different document per cluster from run to run). Each step needs only the edges of one
node at a time, so it runs per partition of nodes (``partition = route(node)``): a task holds
its partition's edges, never the graph. :func:`components` runs the same steps in memory.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from data_prep.dedup.shuffle import done, read_routed, route, write_routed
from data_prep.passes.budget import Budget
from data_prep.storage.workdir import Paths

EDGE_SCHEMA = pa.schema([("u", pa.int64()), ("v", pa.int64())])
EDGE_ROW_BYTES = 64
"""Bytes a component step holds per edge row: the two columns read, the sort permutation, the
sorted copies and the output (measured peak over rows, rounded up)."""


def unique_edges(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (u, v) rows, sorted by u then v."""
    o = np.lexsort((v, u))
    u, v = u[o], v[o]
    keep = np.r_[True, (u[1:] != u[:-1]) | (v[1:] != v[:-1])] if len(u) else np.zeros(0, dtype=bool)
    return u[keep], v[keep]


def _groups(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index of each run of equal u (sorted), and each row's run number."""
    start = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    gid = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(u)]))
    return start, gid


def large_star(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Large-Star over directed rows u → v holding every neighbour of each u. Returns the new edges
    (child, parent) and whether some node had both a smaller and a larger neighbour."""
    u, v = unique_edges(u, v)
    if not len(u):
        return u, v, False
    start, gid = _groups(u)
    m = np.minimum(u[start], np.minimum.reduceat(v, start))[gid]
    larger = v > u
    changed = bool(np.any(m[larger] != u[larger]))
    cu, cv = unique_edges(v[larger], m[larger])
    return cu, cv, changed


def small_star(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Small-Star over rows child u → parent v (v < u) holding every smaller neighbour of each u.
    Returns the new edges and whether some node had more than one smaller neighbour."""
    u, v = unique_edges(u, v)
    if not len(u):
        return u, v, False
    start, gid = _groups(u)
    m = np.minimum.reduceat(v, start)
    changed = len(start) != len(u)
    mm = m[gid]
    other = v != mm
    cu, cv = unique_edges(np.concatenate([v[other], u[start]]), np.concatenate([mm[other], m]))
    return cu, cv, changed


def both_ways(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([u, v]), np.concatenate([v, u])


def components(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In memory: every non-smallest node of every component → the component's smallest node."""
    u, v = child, parent
    while True:
        u, v, changed_large = large_star(*both_ways(u, v))
        u, v, changed_small = small_star(u, v)
        if not (changed_large or changed_small):
            return unique_edges(u, v)


def star_step(
    item: tuple[int, int], step: int, out: str, n: int, memory_gib: float, sources: list[str]
) -> dict[str, Any]:
    """Component step ``step`` over partition ``q`` (of ``n``): odd steps are Large-Star (input:
    both directions of every edge, routed by the first node), even steps Small-Star (input: child →
    parent, routed by the child). The output is routed for the step after. Step 1 reads the edge
    files of the steps named in ``sources`` (``exact``, ``pairs``)."""
    q, rows = item
    paths = Paths.at(out)
    path = paths.dedup_star(step, q)
    if (m := done(path)) is not None:
        return m
    Budget(memory_gib).check(
        f"dedup component step {step}, partition {q} ({rows:,} edges)", rows * EDGE_ROW_BYTES, "raise memory_gib"
    )
    src = (
        [paths.dedup_star(step - 1, i) for i in range(n)]
        if step > 1
        else [paths.dedup_file(kind, i) for kind in sources for i in range(n)]
    )
    e = read_routed(src, q, EDGE_SCHEMA)
    if step % 2:
        u, v, changed = large_star(e["u"], e["v"])
        part = route(u, n)  # Small-Star next: by child
    else:
        u, v, changed = small_star(e["u"], e["v"])
        u, v = both_ways(u, v)  # Large-Star next: both directions, by the first node
        part = route(u, n)
    return write_routed(path, EDGE_SCHEMA, {"u": u, "v": v}, part, n, {"changed": changed})


def stars_in_one_task(rows: int, out: str, n: int, memory_gib: float, sources: list[str]) -> dict[str, Any]:
    """When the whole graph fits one task: read every edge, run :func:`components` in memory, and
    write each non-smallest node → its component's smallest node, routed by node like the last
    step's stars (``stars/s000-q00000.arrow``). Same result as the rounds: the labels are unique."""
    paths = Paths.at(out)
    path = paths.dedup_star(0, 0)
    if (m := done(path)) is not None:
        return m
    Budget(memory_gib).check(f"dedup components ({rows:,} edges)", rows * EDGE_ROW_BYTES, "raise memory_gib")
    src = [paths.dedup_file(kind, i) for kind in sources for i in range(n)]
    parts = [read_routed(src, q, EDGE_SCHEMA) for q in range(n)]
    u, v = (np.concatenate([e[k] for e in parts]) for k in ("u", "v"))
    child, root = components(np.maximum(u, v), np.minimum(u, v))
    return write_routed(path, EDGE_SCHEMA, {"u": child, "v": root}, route(child, n), n)


def _name(out: str, step: int, q: int) -> str:
    """A stars file's name relative to the folder (each process has its own copy of one at a URL)."""
    paths = Paths.at(out)
    return paths.dedup_star(step, q).relative_to(paths.out).as_posix()


def run_stars(
    map_fn: Callable[[Callable, list], Iterable[dict[str, Any]]],
    out: str,
    rows: list[int],
    memory_gib: float,
    sources: list[str],
    one_task_rows: int,
) -> tuple[list[str], int]:
    """Components of the edges in the ``sources`` files (``rows``: edge rows per partition): in
    one task when they are at most ``one_task_rows``, else rounds of Large-Star then Small-Star
    over ``len(rows)`` partitions until a round changes nothing. Returns the files (relative to
    the folder) whose batch q holds the stars of partition q's nodes, and the number of rounds."""
    n, step, rounds = len(rows), 0, 0
    if sum(rows) <= one_task_rows:
        list(map_fn(partial(stars_in_one_task, out=out, n=n, memory_gib=memory_gib, sources=sources), [sum(rows)]))
        return [_name(out, 0, 0)], 0
    while True:
        changed = False
        for s in (step + 1, step + 2):
            markers = list(
                map_fn(
                    partial(star_step, step=s, out=out, n=n, memory_gib=memory_gib, sources=sources),
                    list(enumerate(rows)),
                )
            )
            rows = [sum(m["rows"][i] for m in markers) for i in range(n)]
            changed |= any(m["changed"] for m in markers)
        step, rounds = step + 2, rounds + 1
        if not changed:
            return [_name(out, step, i) for i in range(n)], rounds
