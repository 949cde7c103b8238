"""Where the shipped per-language filter thresholds (configs/data/demo.yaml ``filters.languages``)
come from: what they drop of clean text from sources they were not derived from, and whether they
still drop junk (run by hand; prints figures; tests/data_prep/calibration/test_filter_defaults.py
pins both sides).

    python -m data_prep.calibration.filter_defaults [--config configs/data/demo.yaml] [--set en.max_char_rep=0.106]
    python -m data_prep.calibration.filter_defaults --derive    # the thresholds to ship, as the recipe lists them

Clean text: ``--corpus``, by default ../shared/corpus (news, legal news, declarations,
classification sentences in BLOOM's 46 natural languages; code in its 13 programming languages),
normalised as ``prepare`` does, through the language-ID and quality steps. Every document names
its source (``owner/repo``).

* **Held-out sources** (the figure that matters: our acceptance text is other sources of the same
  languages): for every natural language with two or more sources, each source in turn is held
  out, the thresholds are derived (data_prep/calibration/thresholds.py) from the language's other sources,
  and the held-out source is checked against them. Target: at most 1% of any language dropped.
  Junk (data_prep/calibration/junk.py's four kinds) built from the held-out source must all be dropped.
  Languages with one source (ak, ki, tum) have no held-out source and are listed as such.
* **The shipped recipe** (``--config``): its thresholds, derived from every source, on all of the
  corpus, the same way; what it drops there is the in-sample figure.

Scores are computed once per document (they depend on n-gram sizes, not on thresholds); each fold
then only derives and compares.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bloomline import REPO
from bloomline.errors import BloomlineError, DataError

SHARED = REPO.parent / "shared" / "corpus"
"""The clean corpus of the shipped thresholds (the default ``--corpus``)."""


@dataclass
class Doc:
    id: str
    text: str
    lang: str
    source: str
    """``owner/repo`` of the source the document came from ("" when not given)."""


Docs = dict[str, list[Doc]]
"""Per language: its documents."""


def corpus(root: Path) -> Docs:
    """Every document under ``root`` (JSONL files), by language, text normalised as ``prepare``
    does."""
    from bloomline import languages
    from data_prep.steps.normalize import normalize_text

    out: Docs = {}
    for f in sorted(root.rglob("*.jsonl")):
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            label = str(r.get("lang", ""))
            lang = languages.resolve(label) or languages.resolve(f"code-{label}")
            if lang is None or not isinstance(r.get("text"), str):
                continue  # a derivation needs the language: prepare books these as errors
            source = str(r.get("source", "")).split(":")[0]
            out.setdefault(lang, []).append(Doc(str(r.get("id", f"{f}:{n}")), normalize_text(r["text"]), lang, source))
    return out


def langid_drops(cfg: Any, docs: Docs) -> set[str]:
    """Ids of the documents the language-ID step drops (its verdict does not depend on the quality
    thresholds, so it is taken once)."""
    from data_prep.steps.document import Document, Ledger
    from data_prep.steps.langid import LanguageIdFilter

    step = LanguageIdFilter(cfg.langid, Ledger())
    every = [d for ds in docs.values() for d in ds]
    kept = {d.id for d in step.run(Document(d.text, d.lang, d.id, i) for i, d in enumerate(every))}
    return {d.id for d in every} - kept


def scores_of(texts: list[str], lang: str, recipe: Any) -> list[dict[str, float | None]]:
    """The quality scores of ``texts`` in ``lang`` under ``recipe``'s n-gram sizes."""
    from bloomline import languages
    from data_prep.steps.filters import batch_scores
    from data_prep.steps.scores import TextBatch
    from data_prep.steps.text import unspaced_letters

    han = unspaced_letters(languages.get(lang).script) or False
    return [r for i in range(0, len(texts), 256) for r in batch_scores(TextBatch(texts[i : i + 256], han), recipe)]


def junk_of(docs: list[Doc], per_source: int) -> list[tuple[str, str]]:
    """(kind, junk text) of every kind built from the first ``per_source`` documents of each source."""
    from data_prep.calibration.junk import KINDS

    rng = random.Random(0)
    firsts: dict[str, list[Doc]] = {}
    for d in docs:
        if len(firsts.setdefault(d.source, [])) < per_source:
            firsts[d.source].append(d)
    return [(kind, make(d.text, rng)) for ds in firsts.values() for d in ds for kind, make in KINDS.items()]


@dataclass
class Verdict:
    """What one set of thresholds does to one language's clean documents and junk."""

    docs: int
    drops: Counter
    junk_kept: list[tuple[str, str]]
    """(kind, text) of each junk document that was not dropped."""


def judge(
    docs: list[Doc], clean: list[dict], junk: list[tuple[str, str]], junk_scores: list[dict], t: Any, lid: set[str]
) -> Verdict:
    from data_prep.steps.filters import first_failure

    drops: Counter = Counter()
    for d, s in zip(docs, clean):
        failed = "lang_mismatch" if d.id in lid else (first_failure(s, t) or (None,))[0]
        if failed:
            drops[failed] += 1
    kept = [(kind, text) for (kind, text), s in zip(junk, junk_scores) if first_failure(s, t) is None]
    return Verdict(len(docs), drops, kept)


def thresholds(recipe: Any, derived: dict[str, float]) -> Any:
    from bloomline.config import from_dict, to_dict
    from data_prep.config import QualityThresholds

    return from_dict(QualityThresholds, {**to_dict(recipe), **derived})


def derive_for(lang: str, docs: list[Doc], defaults: Any, junk_per_source: int = 5) -> dict[str, float]:
    """data_prep/calibration/thresholds.py's thresholds of ``lang`` from ``docs`` and the junk built from them."""
    from data_prep.calibration.thresholds import base, derive

    recipe = base(lang, defaults)
    by_kind: dict[str, list] = {}
    junk = junk_of(docs, junk_per_source)
    for (kind, _), s in zip(junk, scores_of([t for _, t in junk], lang, recipe)):
        by_kind.setdefault(kind, []).append(s)
    return derive(scores_of([d.text for d in docs], lang, recipe), by_kind, recipe)


def derive_all(cfg: Any, docs: Docs) -> dict[str, dict[str, float]]:
    """The shipped thresholds: every natural language's, derived from all of its documents (every
    source) and the ROOTS base (not the recipe's languages, which hold the last derivation)."""
    from bloomline import languages

    return {
        lang: derive_for(lang, ds, cfg.filters.defaults)
        for lang, ds in sorted(docs.items())
        if languages.get(lang).kind != "code"
    }


def held_out_sources(cfg: Any, docs: Docs, lid: set[str] | None = None) -> dict[str, Verdict | None]:
    """Per natural language, the verdict on each of its sources held out in turn (summed over the
    sources), the thresholds derived from its other sources; None for a language with one source."""
    from bloomline import languages
    from data_prep.calibration.thresholds import base

    lid = langid_drops(cfg, docs) if lid is None else lid
    out: dict[str, Verdict | None] = {}
    for lang, ds in sorted(docs.items()):
        if languages.get(lang).kind == "code":
            continue
        sources = sorted({d.source for d in ds})
        if len(sources) < 2:
            out[lang] = None
            continue
        recipe = base(lang, cfg.filters.defaults)
        clean = dict(zip((d.id for d in ds), scores_of([d.text for d in ds], lang, recipe)))
        total = Verdict(0, Counter(), [])
        for src in sources:
            held = [d for d in ds if d.source == src]
            t = thresholds(recipe, derive_for(lang, [d for d in ds if d.source != src], cfg.filters.defaults))
            junk = junk_of(held, 1)
            v = judge(held, [clean[d.id] for d in held], junk, scores_of([x for _, x in junk], lang, recipe), t, lid)
            total.docs += v.docs
            total.drops.update(v.drops)
            total.junk_kept.extend(v.junk_kept)
        out[lang] = total
    return out


def in_sample(cfg: Any, docs: Docs, lid: set[str] | None = None) -> dict[str, Verdict]:
    """Per language, the recipe's own thresholds on ``docs`` (code: the code checks)."""
    from bloomline import languages
    from data_prep.steps.filters import CODE_CHECKS, code_scores, first_failure

    lid = langid_drops(cfg, docs) if lid is None else lid
    out = {}
    for lang, ds in sorted(docs.items()):
        if languages.get(lang).kind == "code":
            drops = Counter(
                f[0] for d in ds if (f := first_failure(code_scores(d.text), cfg.filters.code, CODE_CHECKS))
            )
            out[lang] = Verdict(len(ds), drops, [])
            continue
        t = cfg.filters.for_language(lang)
        junk = junk_of(ds, 1)
        out[lang] = judge(
            ds, scores_of([d.text for d in ds], lang, t), junk, scores_of([x for _, x in junk], lang, t), t, lid
        )
    return out


def report(name: str, res: dict[str, Verdict | None]) -> list[str]:
    """Print the languages by drop rate; return those over 1% or with junk kept."""
    have = {lang: v for lang, v in res.items() if v is not None}
    worst = sorted(have.items(), key=lambda kv: -sum(kv[1].drops.values()) / kv[1].docs)
    print(f"{name}: {sum(v.docs for v in have.values()):,} documents, {len(have)} languages")
    for lang, v in worst:
        d = sum(v.drops.values())
        if d:
            print(
                f"  {lang:10s} {d:4d}/{v.docs:4d} dropped ({100 * d / v.docs:5.2f}%){'  > 1%' if d > 0.01 * v.docs else ''}: "
                + ", ".join(f"{k} {n}" for k, n in v.drops.most_common())
            )
    if worst:
        lang, v = worst[0]
        print(f"  worst language: {lang}, {100 * sum(v.drops.values()) / v.docs:.2f}% dropped")
    over = [lang for lang, v in have.items() if sum(v.drops.values()) > 0.01 * v.docs]
    print(f"  languages over 1%: {len(over)} {over}")
    none = sorted(lang for lang, v in res.items() if v is None)
    if none:
        print(f"  languages with one source (no held-out source): {none}")
    kept = [(lang, kind, text) for lang, v in have.items() for kind, text in v.junk_kept]
    print(f"  junk documents kept: {len(kept)}")
    for lang, kind, text in kept[:20]:
        print(f"    {lang} {kind}: {text[:100]!r}")
    return over + [lang for lang, _, _ in kept]


def main(argv: list[str] | None = None) -> int:
    """The command: ``--derive`` prints the thresholds to ship, as the recipe's ``filters.languages``
    lists them; otherwise the held-out and in-sample reports. A user's error (a missing corpus or
    config, a bad ``--set``) ends it in one ``error:`` line with exit status 2."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs/data/demo.yaml")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="change the recipe's defaults")
    ap.add_argument("--derive", action="store_true", help="print the thresholds derived from every source")
    ap.add_argument("--corpus", type=Path, default=SHARED, help="the clean corpus (default: ../shared/corpus)")
    args = ap.parse_args(argv)
    try:
        run(args.config, args.sets, args.corpus, args.derive)
    except BloomlineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def run(config: Path, sets: list[str], root: Path, derive: bool) -> None:
    """The recipe ``config`` with ``sets`` applied, on the clean corpus ``root``: its reports, or
    with ``derive`` the thresholds to ship."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.reports.filter_report import parse_set

    if not root.is_dir():
        raise DataError(f"{root}: no such folder (the clean corpus: ../shared/corpus, or --corpus)")
    cfg = load_config(PrepareConfig, config)
    if sets:
        cfg.filters = parse_set(sets, cfg.filters)
    docs = corpus(root)
    if derive:
        from data_prep.calibration.thresholds import as_overrides

        for lang, values in as_overrides(derive_all(cfg, docs)).items():
            print(f"    {lang}: {{{', '.join(f'{k}: {json.dumps(v)}' for k, v in values.items())}}}")
        return
    lid = langid_drops(cfg, docs)
    report(
        f"held-out sources of {root} (thresholds derived from each language's other sources)",
        held_out_sources(cfg, docs, lid),
    )
    report(f"the recipe {config.name} on all of {root} (in sample)", in_sample(cfg, docs, lid))


if __name__ == "__main__":
    sys.exit(main())
