"""Exact order statistics of streams too large to hold: a radix select over the values' bits.

The values of many groups (a language's score for one check) arrive in batches, as often as
asked (one pass = one read of the files). Each float64 maps to a uint64 that sorts as the float
does. A pass counts, per sought rank, the values under the prefix found so far by their next
``BITS`` bits, which narrows the rank to one bin; once a bin holds at most ``COLLECT`` values,
they are gathered and sorted. Memory is the histograms and the gathered bins, whatever the number
of values: ``O(groups × ranks × (2^BITS + COLLECT))`` at worst, with no approximation —
the results equal ``numpy.quantile`` (linear interpolation) on the whole stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

BITS = 12
COLLECT = 1 << 15
SIGN = np.uint64(1 << 63)

Batches = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""Starts a pass: yields ``(group, value)`` arrays (int64 group ids, float64 values, no NaN)."""


def to_key(v: np.ndarray) -> np.ndarray:
    """uint64 keys ordered as the float64 values are (−0.0 and 0.0 fold together)."""
    b = (v + 0.0).view(np.uint64)
    return np.where(b & SIGN, ~b, b | SIGN)


def from_key(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, dtype=np.uint64)
    return np.where(k & SIGN, k & ~SIGN, ~k).view(np.float64)


@dataclass
class _Seek:
    """One sought rank of one group."""

    group: int
    asked: int
    rank: int = -1  # the rank within the prefix's values
    prefix: int = 0  # the key's top bits found so far
    shift: int = 64  # bits of the key below the prefix
    collect: bool = False
    value: float | None = None
    hist: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    gathered: list = field(default_factory=list, repr=False)


def _by_group(batches: Batches):
    """Per batch, its values split by group: ``{group: keys}``."""
    for g, v in batches():
        if not len(g):
            continue
        o = np.argsort(g, kind="stable")
        g, k = g[o], to_key(v[o])
        cuts = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
        yield {int(g[a]): k[a:b] for a, b in zip(cuts[:-1], cuts[1:])}


def order_stats(batches: Batches, ranks: dict[int, list[int]]) -> dict[tuple[int, int], float]:
    """The values at the given 0-based ``ranks`` of each group's sorted values: ``{(group, rank): value}``."""
    seeks = [_Seek(g, r, r) for g, rs in ranks.items() for r in sorted(set(rs))]
    while any(s.value is None for s in seeks):
        open_ = [s for s in seeks if s.value is None]
        for s in open_:
            if not s.collect:
                s.hist = np.zeros(1 << min(BITS, s.shift), dtype=np.int64)
        by_group: dict[int, list[_Seek]] = {}
        for s in open_:
            by_group.setdefault(s.group, []).append(s)
        for split in _by_group(batches):
            for g, seek in by_group.items():
                k = split.get(g)
                if k is None:
                    continue
                for s in seek:
                    mine = k if s.shift == 64 else k[(k >> np.uint64(s.shift)) == np.uint64(s.prefix)]
                    if s.collect:
                        s.gathered.append(mine)
                    else:
                        bits = min(BITS, s.shift)
                        low = (mine >> np.uint64(s.shift - bits)) & np.uint64((1 << bits) - 1)
                        s.hist += np.bincount(low.astype(np.int64), minlength=1 << bits)
        for s in open_:
            if s.collect:
                s.value = float(from_key(np.sort(np.concatenate(s.gathered))[s.rank]))
                continue
            bits = min(BITS, s.shift)
            cum = np.cumsum(s.hist)
            b = int(np.searchsorted(cum, s.rank, side="right"))
            s.rank -= int(cum[b - 1]) if b else 0
            s.prefix, s.shift = (s.prefix << bits) | b, s.shift - bits
            if s.shift == 0:
                s.value = float(from_key(np.uint64(s.prefix)))
            elif s.hist[b] <= COLLECT:
                s.collect = True
            s.hist = None
    return {(s.group, s.asked): s.value for s in seeks}


def quantiles(batches: Batches, counts: dict[int, int], qs: Iterable[float]) -> dict[int, list[float]]:
    """Per group with values, ``numpy.quantile(values, qs)`` (linear interpolation), exactly."""
    qs = list(qs)

    def at(n: int, q: float) -> tuple[int, int, float]:
        h = (n - 1) * q  # numpy's virtual index for method="linear"
        return int(np.floor(h)), min(int(np.floor(h)) + 1, n - 1), h - np.floor(h)

    want = {g: sorted({r for q in qs for r in at(n, q)[:2]}) for g, n in counts.items() if n}
    got = order_stats(batches, want)
    out: dict[int, list[float]] = {}
    for g in want:
        row = []
        for q in qs:
            lo_i, hi_i, t = at(counts[g], q)
            a, b = got[(g, lo_i)], got[(g, hi_i)]
            d = b - a  # numpy's _lerp: from the nearer end
            row.append(float(b - d * (1 - t) if t >= 0.5 else a + d * t))
        out[g] = row
    return out
