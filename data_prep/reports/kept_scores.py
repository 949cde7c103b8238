"""The quality filter's recorded scores read back (``DIR/scores/``, data_prep/storage/droplog.py), a
record batch at a time: by language, the decision any thresholds would make (:func:`decide`, in
ROOTS' order, vectorised per language exactly as ``data_prep.steps.filters.first_failure`` does per
document), and the kept documents' quantiles and margins per check (:func:`kept_stats`, the
manifest's ``stages.quality.kept_scores``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow.parquet as pq

from bloomline import languages
from data_prep.config import FilterConfig
from data_prep.reports.quantiles import quantiles
from data_prep.steps.filters import CHECKS, CODE_CHECKS, Check
from data_prep.storage.droplog import SCORE_SCHEMA, SCORES_DIR

QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
EDGE = 0.10
"""A kept document is "near the edge" of a check when its score is within this fraction of the threshold."""


def checks_of(lang: str, cfg: FilterConfig) -> tuple[tuple[Check, ...], Any]:
    """The checks and thresholds that apply to ``lang``."""
    if languages.get(lang).kind == "code":
        return CODE_CHECKS, cfg.code
    return CHECKS, cfg.for_language(lang)


BATCH_ROWS = 1 << 16
"""Rows of ``DIR/scores/`` or ``DIR/dropped/`` held at once: the reports stream record batches,
so their memory does not grow with the corpus."""


def score_batches(
    out: Path, columns: Optional[list[str]] = None, batch_rows: int = BATCH_ROWS
) -> Iterator[dict[str, np.ndarray]]:
    """The recorded scores a record batch at a time, in file order: ``lang`` and ``reason``
    (object arrays, reason None = kept) and each score column as float64 (NaN where it does not apply)."""
    folder = Path(out) / SCORES_DIR
    names = columns or [f.name for f in SCORE_SCHEMA]
    for f in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_rows, columns=names):
            yield {
                k: (
                    np.array(b.column(k).to_pylist(), dtype=object)
                    if k in ("lang", "reason")
                    else b.column(k).to_numpy(zero_copy_only=False).astype(np.float64)
                )
                for k in names
            }


def by_language(batch: dict[str, np.ndarray]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """The rows of one batch split by language (languages in sorted order)."""
    langs = batch["lang"]
    for lang in sorted(set(langs.tolist())):
        sel = langs == lang
        yield lang, {k: v[sel] for k, v in batch.items() if k != "lang"}


def decide(scores: dict[str, np.ndarray], checks: tuple[Check, ...], thresholds: Any) -> np.ndarray:
    """The reason each document fails first (None: kept) under ``thresholds``."""
    n = len(scores["reason"])
    out = np.full(n, None, dtype=object)
    open_ = np.ones(n, dtype=bool)
    for c in checks:
        v, limit = scores[c.score], getattr(thresholds, c.limit)
        with np.errstate(invalid="ignore"):
            fail = open_ & ~np.isnan(v) & ((v < limit) if c.below else (v > limit))
        out[fail] = c.reason
        open_ &= ~fail
    return out


HELD_VALUES = 1 << 21
"""Kept scores held in memory at most (2M, 32 MiB with their group ids): up to this, the counting
pass keeps them and the quantiles are read off one sort; beyond it (a corpus of over about
300,000 documents), data_prep/reports/quantiles.py finds them in a few more streamed passes. At 8M the
driver of a 4 GB prepare peaked 125 MiB above its peak at 256 MB (bench/scale.py: 1.25×, the
limit of flat), all of it these held values."""


def kept_stats(
    out: Path, cfg: FilterConfig, batch_rows: int = BATCH_ROWS, held_values: int = HELD_VALUES
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per language and check: quantiles of the score over *kept* documents, the threshold, and how
    many kept documents lie within ``EDGE`` of it (the manifest's ``stages.quality.kept_scores``).

    One pass counts (min, max, near the threshold) and holds the values while they fit
    ``held_values``; past that, the exact quantiles take a few more streamed passes, holding
    batches and histograms, never a column."""
    groups = _Groups(out, cfg, batch_rows)
    tally = _Tally(groups.limits, held_values)
    for g, v in groups.kept_values():
        tally.add(g, v)
    qs = quantiles(groups.kept_values, tally.count, QUANTILES, held=tally.held_pairs())
    res: dict[str, dict[str, dict[str, Any]]] = {}
    for lang, reason in sorted(groups.ids, key=lambda k: (k[0], groups.ids[k])):
        gid = groups.ids[(lang, reason)]
        limit, below = groups.limits[gid]
        res.setdefault(lang, {})[reason] = {
            "threshold": limit,
            "fails": "below" if below else "above",
            **{f"p{round(p * 100):d}": round(x, 6) for p, x in zip(QUANTILES, qs[gid])},
            "min": round(tally.lo[gid], 6),
            "max": round(tally.hi[gid], 6),
            "kept": tally.count[gid],
            "near_threshold": tally.near[gid],
        }
    return res


class _Groups:
    """The kept documents' scores as (group id, value) arrays, a group being one (language, check);
    ids are given in the order groups are first met, with each group's (threshold, fails below)."""

    def __init__(self, out: Path, cfg: FilterConfig, batch_rows: int):
        self.out, self.cfg, self.batch_rows = out, cfg, batch_rows
        self.ids: dict[tuple[str, str], int] = {}
        self.limits: list[tuple[float, bool]] = []

    def kept_values(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """One pass over the recorded scores: per batch, every kept document's value of each check
        that applies to it (NaN: not applicable, left out)."""
        for batch in score_batches(self.out, batch_rows=self.batch_rows):
            gids, vals = [], []
            for lang, s in by_language(batch):
                checks, t = checks_of(lang, self.cfg)
                kept = s["reason"] == None  # noqa: E711 - element-wise on an object array
                for c in checks:
                    v = s[c.score][kept]
                    v = v[~np.isnan(v)]
                    if not len(v):
                        continue
                    if (lang, c.reason) not in self.ids:
                        self.ids[(lang, c.reason)] = len(self.ids)
                        self.limits.append((float(getattr(t, c.limit)), c.below))
                    gids.append(np.full(len(v), self.ids[(lang, c.reason)], dtype=np.int64))
                    vals.append(v)
            if gids:
                yield np.concatenate(gids), np.concatenate(vals)


class _Tally:
    """Per group: count, min, max and how many lie within ``EDGE`` of the threshold; and the values
    themselves while they fit ``held_values`` (then the quantiles are read off one sort)."""

    def __init__(self, limits: list[tuple[float, bool]], held_values: int):
        self.limits, self.held_values = limits, held_values
        self.count: dict[int, int] = {}
        self.lo: dict[int, float] = {}
        self.hi: dict[int, float] = {}
        self.near: dict[int, int] = {}
        self.held: list[tuple[np.ndarray, np.ndarray]] | None = []
        self.n_held = 0

    def add(self, g: np.ndarray, v: np.ndarray) -> None:
        o = np.argsort(g, kind="stable")
        g, v = g[o], v[o]
        cuts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        lim = np.array([self.limits[i][0] for i in g[cuts]])
        below = np.array([self.limits[i][1] for i in g[cuts]])
        sizes = np.diff(np.r_[cuts, len(g)])
        edge = np.where(
            np.repeat(below, sizes), v <= np.repeat(lim * (1 + EDGE), sizes), v >= np.repeat(lim * (1 - EDGE), sizes)
        )
        for gid, n, a, b, e in zip(
            g[cuts].tolist(),
            sizes.tolist(),
            np.minimum.reduceat(v, cuts).tolist(),
            np.maximum.reduceat(v, cuts).tolist(),
            np.add.reduceat(edge.astype(np.int64), cuts).tolist(),
        ):
            self.count[gid] = self.count.get(gid, 0) + n
            self.lo[gid] = min(self.lo.get(gid, np.inf), a)
            self.hi[gid] = max(self.hi.get(gid, -np.inf), b)
            self.near[gid] = self.near.get(gid, 0) + e
        if self.held is not None:
            self.n_held += len(v)
            if self.n_held <= self.held_values:
                self.held.append((g, v))
            else:
                self.held = None  # too many to hold: the quantiles stream

    def held_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self.held:
            return None
        return np.concatenate([g for g, _ in self.held]), np.concatenate([v for _, v in self.held])
