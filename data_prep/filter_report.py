"""What the quality filter did and what another threshold would do, from the recorded scores.

``DIR/scores/`` holds every score of every document the quality filter checked
(data_prep/droplog.py), so the filter's decision can be recomputed for any thresholds without
running the pipeline: :func:`decide` applies the checks in ROOTS' order to the recorded scores,
vectorised per language, exactly as ``data_prep.filters.first_failure`` does per document. Only
thresholds can change this way; the n-gram sizes and the flagged-word lists shape the scores
themselves and need a new run (:func:`parse_set` refuses them).

The what-if counts are the quality filter's own (documents that reach it, before deduplication):
a document kept by a looser threshold may still be dropped later as a duplicate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from bloomline import languages
from bloomline.config import from_dict
from bloomline.errors import ConfigError
from data_prep.config import CodeThresholds, FilterConfig, QualityThresholds
from data_prep.droplog import SCORE_SCHEMA, SCORES_DIR, read_dataset
from data_prep.filters import CHECKS, CODE_CHECKS

QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
EDGE = 0.10
"""A kept document is "near the edge" of a check when its score is within this fraction of the threshold."""
_FIXED = {"char_rep_n", "word_rep_n", "flagged_words"}


def checks_of(lang: str, cfg: FilterConfig) -> tuple[tuple, Any]:
    """The checks and thresholds that apply to ``lang``."""
    if languages.BY_CODE[lang].kind == "code":
        return CODE_CHECKS, cfg.code
    return CHECKS, cfg.for_language(lang)


def load_scores(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per language, each score column as float64 (NaN where a score does not apply) and
    ``reason`` (object array, None = kept) of ``DIR/scores/``."""
    t = read_dataset(Path(out) / SCORES_DIR, SCORE_SCHEMA)
    if t.num_rows == 0:
        return {}
    langs = np.array(t.column("lang").to_pylist(), dtype=object)
    cols = {f.name: (np.array(t.column(f.name).to_pylist(), dtype=object) if f.name == "reason" else
                     t.column(f.name).to_numpy(zero_copy_only=False).astype(np.float64))
            for f in SCORE_SCHEMA if f.name != "lang"}
    return {lg: {k: v[langs == lg] for k, v in cols.items()} for lg in sorted(set(langs.tolist()))}


def decide(scores: dict[str, np.ndarray], checks: tuple, thresholds: Any) -> np.ndarray:
    """The reason each document fails first (None: kept) under ``thresholds``."""
    n = len(scores["reason"])
    out = np.full(n, None, dtype=object)
    open_ = np.ones(n, dtype=bool)
    for reason, score, field_, below in checks:
        v, limit = scores[score], getattr(thresholds, field_)
        with np.errstate(invalid="ignore"):
            fail = open_ & ~np.isnan(v) & ((v < limit) if below else (v > limit))
        out[fail] = reason
        open_ &= ~fail
    return out


def kept_stats(out: Path, cfg: FilterConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """Per language and check: quantiles of the score over *kept* documents, the threshold, and how
    many kept documents lie within ``EDGE`` of it (the manifest's ``stages.quality.kept_scores``)."""
    res: dict[str, dict[str, dict[str, Any]]] = {}
    for lang, s in load_scores(out).items():
        checks, t = checks_of(lang, cfg)
        kept = np.array([r is None for r in s["reason"]])
        for reason, score, field_, below in checks:
            v = s[score][kept]
            v = v[~np.isnan(v)]
            if not len(v):
                continue
            limit = float(getattr(t, field_))
            edge = (v <= limit * (1 + EDGE)) if below else (v >= limit * (1 - EDGE))
            q = np.quantile(v, QUANTILES)
            res.setdefault(lang, {})[reason] = {
                "threshold": limit, "fails": "below" if below else "above",
                **{f"p{round(p * 100):d}": round(float(x), 6) for p, x in zip(QUANTILES, q)},
                "min": round(float(v.min()), 6), "max": round(float(v.max()), 6),
                "kept": int(len(v)), "near_threshold": int(edge.sum())}
    return res


def parse_set(items: list[str], cfg: FilterConfig) -> FilterConfig:
    """``cfg`` with ``--set`` changes applied: ``LANG.FIELD=VALUE`` (one language), ``defaults.FIELD=VALUE``
    (languages without their own entry) or ``code.FIELD=VALUE``."""
    new = dataclasses.replace(cfg, languages={k: dict(v) for k, v in cfg.languages.items()})
    for item in items:
        key, sep, value = item.partition("=")
        where, dot, field_ = key.partition(".")
        if not (sep and dot and field_):
            raise ConfigError("--set", f"{item!r}: expected LANG.FIELD=VALUE, e.g. en.max_char_rep=0.15")
        if field_ in _FIXED:
            raise ConfigError("--set", f"{field_} shapes the recorded scores themselves: a what-if can change "
                                       "thresholds only; prepare again to change it")
        target = CodeThresholds if where == "code" else QualityThresholds
        if field_ not in {f.name for f in dataclasses.fields(target)}:
            raise ConfigError("--set", f"{item!r}: {target.__name__} has no field {field_!r}")
        try:
            v: Any = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise ConfigError("--set", f"{item!r}: {value!r} is not a number") from None
        if where == "code":
            new = dataclasses.replace(new, code=from_dict(CodeThresholds, {**dataclasses.asdict(new.code), field_: v}))
        elif where == "defaults":
            new = dataclasses.replace(new, defaults=from_dict(QualityThresholds,
                                                              {**dataclasses.asdict(new.defaults), field_: v}))
        else:
            lang = languages.resolve(where)
            if lang is None:
                raise ConfigError("--set", f"{where!r} is not one of BLOOM's languages")
            entry = next((k for k in new.languages if languages.resolve(k) == lang), lang)
            new.languages[entry] = {**new.languages.get(entry, {}), field_: v}
    new.validate()
    return new


def what_if(out: Path, proposed: FilterConfig) -> dict[str, dict[str, Any]]:
    """Per language: documents the filter checked, kept now (the run's recorded decisions), kept under
    ``proposed``, and the drops by reason under ``proposed`` — languages whose
    decisions change only."""
    res: dict[str, dict[str, Any]] = {}
    for lang, s in load_scores(out).items():
        now = s["reason"]  # what the run decided, recorded with the scores
        then = decide(s, *checks_of(lang, proposed))
        if np.array_equal(now, then):
            continue
        by_reason: dict[str, int] = {}
        for r in then[then != None]:  # noqa: E711 (object array)
            by_reason[r] = by_reason.get(r, 0) + 1
        kept_now, kept_then = int((now == None).sum()), int((then == None).sum())  # noqa: E711
        res[lang] = {"checked": len(now), "kept_now": kept_now, "kept_then": kept_then,
                     "gained": int(((now != None) & (then == None)).sum()),  # noqa: E711
                     "lost": int(((now == None) & (then != None)).sum()),  # noqa: E711
                     "dropped_by_reason": dict(sorted(by_reason.items()))}
    return res


def drop_examples(out: Path, lang: Optional[str] = None, reason: Optional[str] = None,
                  n: int = 3) -> dict[str, dict[str, dict[str, Any]]]:
    """Per language and ``outcome:reason``: the count and the first ``n`` rows (input order) of the
    drop log. Streams it: counts come from three columns, examples from record batches read in
    file order until every group has its ``n`` (memory: one batch, not the log)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from data_prep.droplog import DROP_SCHEMA, DROPPED_DIR

    folder = Path(out) / DROPPED_DIR

    def selected(t: pa.Table) -> pa.Table:
        if lang:
            t = t.filter(pc.equal(t["lang"], lang))
        if reason:
            t = t.filter(pc.equal(t["reason"], reason))
        return t

    keys = selected(read_dataset(folder, DROP_SCHEMA, ["lang", "outcome", "reason"]))
    res: dict[str, dict[str, dict[str, Any]]] = {}
    for row in keys.group_by(["lang", "outcome", "reason"]).aggregate([([], "count_all")]).to_pylist():
        res.setdefault(row["lang"], {})[f"{row['outcome']}:{row['reason']}"] = {"count": row["count_all"], "examples": []}
    missing = sum(min(n, e["count"]) for r in res.values() for e in r.values())
    for f in sorted(folder.glob("*.parquet")) if (missing and folder.is_dir()) else []:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=4096):
            for row in selected(pa.Table.from_batches([batch])).to_pylist():
                e = res[row["lang"]][f"{row['outcome']}:{row['reason']}"]
                if len(e["examples"]) < n:
                    e["examples"].append(row)
                    missing -= 1
            if not missing:
                break
        if not missing:
            break
    return {k: dict(sorted(v.items(), key=lambda kv: (-kv[1]["count"], kv[0]))) for k, v in sorted(res.items())}


def _cell(text: Optional[str], width: int = 160) -> str:
    if text is None:
        return "(no text: the record could not be read)"
    one = " ".join(text.split())
    return (one[:width] + "…" if len(one) > width else one).replace("|", "\\|")


def render(out: Path, cfg: FilterConfig, lang: Optional[str] = None, reason: Optional[str] = None,
           examples: int = 3, sets: list[str] = ()) -> str:
    """The report as Markdown: drops per language by reason with examples, the kept-score edge
    table, and the what-if table for ``sets``."""
    lines = ["# Filter report", ""]
    drops = drop_examples(out, lang, reason, examples)
    lines += ["## Drops by language and reason", ""]
    if not drops:
        lines += ["No document was dropped" + (" for this selection." if (lang or reason) else "."), ""]
    for lg, reasons in drops.items():
        lines += [f"### {lg} ({languages.BY_CODE[lg].name if lg in languages.BY_CODE else lg})", ""]
        for key, e in reasons.items():
            lines.append(f"- **{key}**: {e['count']:,}")
            for r in e["examples"]:
                score = "" if r["score"] is None else f" score {r['score']:.4g} vs {r['threshold']:.4g};"
                dup = f" duplicate of {r['duplicate_of']};" if r["duplicate_of"] else ""
                lines.append(f"  - `{r['id']}` ({r['source']}):{score}{dup} {_cell(r['text'])}")
        lines.append("")
    stats = kept_stats(out, cfg)
    if lang:
        stats = {k: v for k, v in stats.items() if k == lang}
    if stats:
        lines += ["## Kept documents near a threshold", "",
                  f"Kept documents whose score lies within {EDGE:.0%} of a threshold, and the score's spread over kept documents.", "",
                  "| language | check | threshold | near | kept | p1 | p50 | p99 | max |", "|---|---|---|---|---|---|---|---|---|"]
        for lg, checks in stats.items():
            for r, st in checks.items():
                if reason and r != reason:
                    continue
                lines.append(f"| {lg} | {r} | {st['fails']} {st['threshold']:g} | {st['near_threshold']:,} | {st['kept']:,} | "
                             f"{st['p1']:.4g} | {st['p50']:.4g} | {st['p99']:.4g} | {st['max']:.4g} |")
        lines.append("")
    if sets:
        table = what_if(out, parse_set(list(sets), cfg))
        lines += [f"## What if: {', '.join(sets)}", ""]
        if not table:
            lines += ["No document's decision changes.", ""]
        else:
            lines += ["| language | checked | kept now | kept then | gained | lost | dropped then, by reason |",
                      "|---|---|---|---|---|---|---|"]
            for lg, w in table.items():
                why = ", ".join(f"{k} {v:,}" for k, v in w["dropped_by_reason"].items()) or "-"
                lines.append(f"| {lg} | {w['checked']:,} | {w['kept_now']:,} | {w['kept_then']:,} | {w['gained']:,} | "
                             f"{w['lost']:,} | {why} |")
            lines += ["", "Counts of the quality filter (before deduplication), from the recorded scores."]
    return "\n".join(lines) + "\n"
