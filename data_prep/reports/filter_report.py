"""What the quality filter did and what another threshold would do, from the recorded scores.

``DIR/scores/`` holds every score of every document the quality filter checked
(data_prep/storage/droplog.py), so the filter's decision can be recomputed for any thresholds without
running the pipeline (data_prep/reports/kept_scores.py reads them back and decides). Only
thresholds can change this way; the n-gram sizes and the flagged-word lists shape the scores
themselves and need a new run (:func:`parse_set` refuses them).

The what-if counts are the quality filter's own (documents that reach it, before deduplication):
a document kept by a looser threshold may still be dropped later as a duplicate.

:func:`report` is the whole report of a prepared folder (``bloomline filters``, the
``filter-report`` Prefect artifact at the end of ``prepare``, the dashboard's data page), after
checking the drop log against the manifest's ledger. Texts from the data (documents, ids,
sources, labels) are escaped for Markdown (:func:`md_text`), so a document's markup or Markdown
shows as written wherever the report is rendered.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bloomline import languages
from bloomline.config import from_dict
from bloomline.errors import ConfigError, DataError
from bloomline.terminal import printable
from data_prep.config import CodeThresholds, FilterConfig, QualityThresholds
from data_prep.reports.kept_scores import BATCH_ROWS, EDGE, by_language, checks_of, decide, kept_stats, score_batches
from data_prep.storage.droplog import (
    DROP_SCHEMA,
    DROPPED_DIR,
    SCORES_DIR,
    capped_id,
    check_dropped,
    drop_counts,
)

_FIXED = {"char_rep_n", "word_rep_n", "flagged_words"}
"""Settings that shape the scores themselves: changing one needs a new run."""


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
            raise ConfigError(
                "--set",
                f"{field_} shapes the recorded scores themselves: a what-if can change "
                "thresholds only; prepare again to change it",
            )
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
            new = dataclasses.replace(
                new, defaults=from_dict(QualityThresholds, {**dataclasses.asdict(new.defaults), field_: v})
            )
        else:
            lang = languages.resolve(where)
            if lang is None:
                raise ConfigError("--set", f"{where!r} is not one of {languages.KNOWN}")
            entry = next((k for k in new.languages if languages.resolve(k) == lang), lang)
            new.languages[entry] = {**new.languages.get(entry, {}), field_: v}
    new.validate()
    return new


def what_if(out: Path, proposed: FilterConfig, batch_rows: int = BATCH_ROWS) -> dict[str, dict[str, Any]]:
    """Per language: documents the filter checked, kept now (the run's recorded decisions), kept under
    ``proposed``, and the drops by reason under ``proposed`` — languages whose decisions change
    only. Streamed a record batch at a time."""
    acc: dict[str, dict[str, Any]] = {}
    for batch in score_batches(out, batch_rows=batch_rows):
        for lang, s in by_language(batch):
            now = s["reason"]  # what the run decided, recorded with the scores
            then = decide(s, *checks_of(lang, proposed))
            a = acc.setdefault(
                lang,
                {
                    "checked": 0,
                    "kept_now": 0,
                    "kept_then": 0,
                    "gained": 0,
                    "lost": 0,
                    "dropped_by_reason": {},
                    "changed": False,
                },
            )
            a["changed"] |= not np.array_equal(now, then)
            for r in then[then != None]:  # noqa: E711 (object array)
                a["dropped_by_reason"][r] = a["dropped_by_reason"].get(r, 0) + 1
            a["checked"] += len(now)
            a["kept_now"] += int((now == None).sum())  # noqa: E711
            a["kept_then"] += int((then == None).sum())  # noqa: E711
            a["gained"] += int(((now != None) & (then == None)).sum())  # noqa: E711
            a["lost"] += int(((now == None) & (then != None)).sum())  # noqa: E711
    return {
        lang: {
            **{k: v for k, v in a.items() if k != "changed"},
            "dropped_by_reason": dict(sorted(a["dropped_by_reason"].items())),
        }
        for lang, a in sorted(acc.items())
        if a["changed"]
    }


def drop_examples(
    out: Path, lang: Optional[str] = None, reason: Optional[str] = None, n: int = 3
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per language and ``outcome:reason``: the count and the first ``n`` rows (input order) of the
    drop log. Streams it: counts come from three columns, examples from record batches read in
    file order until every group has its ``n`` (memory: one batch, not the log)."""
    import pyarrow.compute as pc

    folder = Path(out) / DROPPED_DIR

    def selected(t: pa.Table) -> pa.Table:
        if lang:
            t = t.filter(pc.equal(t["lang"], lang))
        if reason:
            t = t.filter(pc.equal(t["reason"], reason))
        return t

    res: dict[str, dict[str, dict[str, Any]]] = {}
    for (lg, outcome, why), count in sorted(drop_counts(folder, lang, reason).items()):
        res.setdefault(lg, {})[f"{outcome}:{why}"] = {"count": count, "examples": []}
    missing = sum(min(n, e["count"]) for r in res.values() for e in r.values())
    for f in sorted(folder.glob("*.parquet")) if (missing and folder.is_dir()) else []:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=4096, columns=DROP_SCHEMA.names):
            for row in selected(pa.Table.from_batches([batch])).to_pylist():
                e = res[row["lang"]][f"{row['outcome']}:{row['reason']}"]
                if len(e["examples"]) < n:  # ids capped again: a drop log written before they were
                    e["examples"].append(
                        {**row, "id": capped_id(row["id"]), "duplicate_of": capped_id(row["duplicate_of"])}
                    )
                    missing -= 1
            if not missing:
                break
        if not missing:
            break
    return {k: dict(sorted(v.items(), key=lambda kv: (-kv[1]["count"], kv[0]))) for k, v in sorted(res.items())}


# Characters with a meaning inside a Markdown line (emphasis, code, links and images, raw HTML
# and entities, table cells, escapes): CommonMark reads any of them after a backslash as itself.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~!#])")


def md_text(text: object) -> str:
    """``text`` as Markdown that renders as the text itself, on one line, its control characters
    shown as escapes (bloomline/terminal.py: ``bloomline filters`` prints the report as it is)."""
    return _MD_SPECIAL.sub(r"\\\1", printable(" ".join(str(text).split()), lines=False))


def md_code(text: object) -> str:
    """``text`` as a Markdown code span (literal: no markup, no escapes), on one line, its control
    characters shown as escapes; its fence is longer than any run of backticks inside it
    (CommonMark, "Code spans")."""
    one = printable(" ".join(str(text).split()), lines=False)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", one)), default=0) + 1)
    pad = " " if one.startswith("`") or one.endswith("`") else ""
    return f"{fence}{pad}{one}{pad}{fence}"


def _cell(text: Optional[str], width: int = 160) -> str:
    if text is None:
        return "(no text: the record could not be read)"
    one = " ".join(text.split())
    return md_text(one[:width] + "…" if len(one) > width else one)


def render(
    out: Path,
    cfg: FilterConfig,
    lang: Optional[str] = None,
    reason: Optional[str] = None,
    examples: int = 3,
    sets: list[str] = (),
    kept: Optional[dict[str, dict[str, dict[str, Any]]]] = None,
    langs: Optional[list[str]] = None,
) -> str:
    """The report as Markdown: drops per language by reason with examples, the kept-score edge
    table (``kept``: :func:`kept_stats` as the manifest holds them; computed when not given), and
    the what-if table for ``sets``; first, which of the data's natural languages (``langs``) have
    fitted thresholds and which ROOTS' defaults."""
    lines = ["# Filter report", ""]
    lines += _thresholds_section(cfg, langs or [])
    lines += _drops_section(drop_examples(out, lang, reason, examples), bool(lang or reason))
    stats = kept if kept is not None else kept_stats(out, cfg)
    lines += _edge_section({k: v for k, v in stats.items() if not lang or k == lang}, reason)
    if sets:
        lines += _what_if_section(what_if(out, parse_set(list(sets), cfg)), sets)
    return "\n".join(lines) + "\n"


def _thresholds_section(cfg: FilterConfig, langs: list[str]) -> list[str]:
    natural = sorted(l for l in langs if languages.resolve(l) and languages.get(l).kind != "code")
    if not cfg.enabled or not natural:
        return []
    own = {languages.resolve(k) for k in cfg.languages}
    fitted, roots = [l for l in natural if l in own], [l for l in natural if l not in own]
    lines = ["## Thresholds", ""]
    if fitted:
        lines.append(f"- fitted (the recipe's `filters.languages`): {md_text(', '.join(fitted))}")
    if roots:
        lines.append(
            f"- ROOTS' defaults, none fitted: {md_text(', '.join(roots))} "
            "(`bloomline filters --derive CLEAN_TEXT` fits them)"
        )
    return [*lines, ""]


def _drops_section(drops: dict[str, dict[str, Any]], selected: bool) -> list[str]:
    lines = ["## Drops by language and reason", ""]
    if not drops:
        lines += ["No document was dropped" + (" for this selection." if selected else "."), ""]
    for lg, reasons in drops.items():
        lines += [f"### {md_text(lg)} ({md_text(languages.get(lg).name if languages.resolve(lg) else lg)})", ""]
        for key, e in reasons.items():
            lines.append(f"- **{key}**: {e['count']:,}")
            for r in e["examples"]:
                score = "" if r["score"] is None else f" score {r['score']:.4g} vs {r['threshold']:.4g};"
                what = "shares an n-gram with task item" if r["reason"] == "contaminated" else "duplicate of"
                dup = f" {what} {md_text(r['duplicate_of'])};" if r["duplicate_of"] else ""
                lines.append(f"  - {md_code(r['id'])} ({md_text(r['source'])}):{score}{dup} {_cell(r['text'])}")
        lines.append("")
    return lines


def _edge_section(stats: dict[str, dict[str, dict[str, Any]]], reason: Optional[str]) -> list[str]:
    if not stats:
        return []
    lines = [
        "## Kept documents near a threshold",
        "",
        f"Kept documents whose score lies within {EDGE:.0%} of a threshold, and the score's spread over kept documents.",
        "",
        "| language | check | threshold | near | kept | p1 | p50 | p99 | max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lg, checks in stats.items():
        for r, st in checks.items():
            if reason and r != reason:
                continue
            lines.append(
                f"| {md_text(lg)} | {r} | {st['fails']} {st['threshold']:g} | {st['near_threshold']:,} | {st['kept']:,} | "
                f"{st['p1']:.4g} | {st['p50']:.4g} | {st['p99']:.4g} | {st['max']:.4g} |"
            )
    return lines + [""]


def _what_if_section(table: dict[str, dict[str, Any]], sets: Sequence[str]) -> list[str]:
    lines = [f"## What if: {', '.join(sets)}", ""]
    if not table:
        return lines + ["No document's decision changes.", ""]
    lines += [
        "| language | checked | kept now | kept then | gained | lost | dropped then, by reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for lg, w in table.items():
        why = ", ".join(f"{k} {v:,}" for k, v in w["dropped_by_reason"].items()) or "-"
        lines.append(
            f"| {md_text(lg)} | {w['checked']:,} | {w['kept_now']:,} | {w['kept_then']:,} | {w['gained']:,} | "
            f"{w['lost']:,} | {why} |"
        )
    return lines + ["", "Counts of the quality filter (before deduplication), from the recorded scores."]


def report(
    data: str | Path,
    lang: Optional[str] = None,
    reason: Optional[str] = None,
    examples: int = 3,
    sets: Sequence[str] = (),
) -> str:
    """The Markdown report of a prepared folder; refuses data without a drop log or whose drop log
    disagrees with its ledger."""
    from data_prep.storage.shards import load_manifest
    from data_prep.storage.workdir import Paths

    paths = Paths.at(data)
    for folder in (DROPPED_DIR, SCORES_DIR) if paths.store else ():  # a folder at a URL: read from a copy
        paths.tree(paths.out / folder)
    paths.get(paths.manifest)
    data = paths.out
    m = load_manifest(data)
    if "dropped" not in m:
        raise DataError(f"{data} was prepared before bloomline kept a drop log: prepare it again for a filter report")
    bad = check_dropped(data, m["languages"])
    if bad:
        raise DataError(
            f"{data}: the drop log does not match the manifest's ledger ({bad[0]}"
            + (f", and {len(bad) - 1} more" if len(bad) > 1 else "")
            + ")"
        )
    code = None
    if lang:
        code = languages.resolve(lang)
        if code is None:
            raise DataError(f"--lang {lang}: not one of {languages.KNOWN}")
    if examples < 0:
        raise DataError("--examples must be >= 0")
    cfg = from_dict(FilterConfig, m["config"]["filters"])
    # the manifest's statistics are kept_stats of this folder with this config, computed when it
    # was written: computing them again cost a prepare run as much again (22 s on 4 GB)
    kept = m.get("stages", {}).get("quality", {}).get("kept_scores")
    return render(data, cfg, code, reason, examples, list(sets), kept, [l for l in m["languages"] if l != "_unknown"])
