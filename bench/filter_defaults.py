"""What the shipped filter thresholds drop of clean text they were and were not tuned on, and
whether they still drop junk (run by hand; prints figures; tests/data_prep/test_filter_defaults.py
pins both sides).

    python bench/filter_defaults.py [--config configs/data/demo.yaml] [--set en.max_char_rep=0.106 ...]
    python bench/filter_defaults.py --derive        # print the derived per-language thresholds

Clean text: ../shared/corpus (news, declarations, classification sentences in BLOOM's 46 natural
languages; code in its 13 programming languages), normalised as ``prepare`` does, through the
language-ID and quality steps. Each language's documents are split in two halves by a hash of
their id: the **tuning** half, from which ``--derive`` sets the thresholds (data_prep/thresholds.py),
and the **held-out** half, which they never saw. Both halves' drop rates are printed; target: at
most 1% of any language, on the held-out half. Junk: data_prep/junk.py's four kinds built from
each language's own text, from each half; every one must be dropped.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import xxhash

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO))

Docs = dict[str, list[tuple[str, str, str]]]
"""Per language: (id, text, language) of its documents."""


def run_steps(cfg: Any, docs: list[tuple[str, str, str]]) -> dict[str, Counter]:
    """Per language, the drop reasons of ``docs`` [(id, text, lang)] through langid + quality."""
    from data_prep.document import Document, Ledger
    from data_prep.filters import QualityFilter
    from data_prep.langid import LanguageIdFilter
    from data_prep.normalize import normalize_text

    ledger = Ledger()
    steps = [LanguageIdFilter(cfg.langid, ledger), QualityFilter(cfg.filters, ledger)]
    stream = (Document(normalize_text(t), lg, i, i) for i, t, lg in docs)
    for s in steps:
        stream = s.run(stream)
    kept = Counter(d.lang for d in stream)
    out: dict[str, Counter] = {}
    for lang, e in ledger.to_dict().items():
        out[lang] = Counter(e["filtered"])
    for lang, n in kept.items():
        out.setdefault(lang, Counter())["kept"] = n
    return out


def corpus(root: Path) -> Docs:
    from bloomline import languages

    out: Docs = {}
    for f in sorted(root.rglob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            lang = languages.resolve(r["lang"]) or languages.resolve(f"code-{r['lang']}")
            out.setdefault(lang, []).append((r["id"], r["text"], lang))
    return out


def halves(docs: Docs) -> tuple[Docs, Docs]:
    """(tuning, held-out): each language's documents split by a hash of their id."""
    tune: Docs = {}
    held: Docs = {}
    for lang, ds in docs.items():
        for d in ds:
            (held if xxhash.xxh64_intdigest(f"half:{d[0]}".encode()) & 1 else tune).setdefault(lang, []).append(d)
    return tune, held


def clean_drops(cfg: Any, docs: Docs) -> dict[str, tuple[int, Counter]]:
    """Per language: (documents, drops by reason) of clean ``docs``."""
    res = {}
    for lang, ds in docs.items():
        got = run_steps(cfg, ds).get(lang, Counter())
        res[lang] = (len(ds), Counter({k: v for k, v in got.items() if k != "kept"}))
    return res


def junk_of(docs: Docs, per_lang: int) -> dict[str, list[tuple[str, str]]]:
    """Per natural language: (kind, junk text) built from its first ``per_lang`` documents."""
    from bloomline import languages
    from data_prep.junk import KINDS

    rng = random.Random(0)
    return {
        lang: [(kind, make(text, rng)) for _, text, _ in ds[:per_lang] for kind, make in KINDS.items()]
        for lang, ds in docs.items()
        if languages.BY_CODE[lang].kind != "code"
    }


def junk_kept(cfg: Any, docs: Docs, per_lang: int = 3) -> list[tuple[str, str, str]]:
    """(language, junk kind, text) of every junk document that was *not* dropped."""
    kept = []
    for lang, junk in junk_of(docs, per_lang).items():
        for kind, text in junk:
            if run_steps(cfg, [("junk", text, lang)]).get(lang, Counter()).get("kept"):
                kept.append((lang, kind, text))
    return kept


def derive_all(cfg: Any, tune: Docs, junk_per_lang: int = 10) -> dict[str, dict[str, float]]:
    """data_prep/thresholds.py's thresholds for every natural language, from the tuning half and
    the ROOTS base (not the recipe's languages, which hold the last derivation)."""
    from bloomline import languages
    from data_prep.filters import quality_scores
    from data_prep.normalize import normalize_text
    from data_prep.thresholds import base, derive

    junk = junk_of(tune, junk_per_lang)
    out = {}
    for lang, ds in sorted(tune.items()):
        if languages.BY_CODE[lang].kind == "code":
            continue
        recipe = base(lang, cfg.filters.defaults)
        han = languages.BY_CODE[lang].script in ("Hans", "Hant")
        scores = lambda texts: [quality_scores(normalize_text(t), recipe, han) for t in texts]  # noqa: E731
        by_kind: dict[str, list] = {}
        for kind, text in junk[lang]:
            by_kind.setdefault(kind, []).extend(scores([text]))
        out[lang] = derive(scores([t for _, t, _ in ds]), by_kind, recipe)
    return out


def report(name: str, res: dict[str, tuple[int, Counter]]) -> list[str]:
    worst = sorted(res.items(), key=lambda kv: -sum(kv[1][1].values()) / kv[1][0])
    print(f"{name}: {sum(n for n, _ in res.values()):,} documents, {len(res)} languages")
    for lang, (n, c) in worst:
        d = sum(c.values())
        if d:
            print(
                f"  {lang:10s} {d:4d}/{n:4d} dropped ({100 * d / n:5.2f}%){'  > 1%' if d > 0.01 * n else ''}: "
                + ", ".join(f"{k} {v}" for k, v in c.most_common())
            )
    over = [lang for lang, (n, c) in res.items() if sum(c.values()) > 0.01 * n]
    print(f"  languages over 1%: {len(over)} {over}")
    return over


def main() -> None:
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.filter_report import parse_set

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs/data/demo.yaml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--derive", action="store_true", help="print the thresholds derived from the tuning half")
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    cfg = load_config(PrepareConfig, args.config)
    if args.sets:
        cfg.filters = parse_set(args.sets, cfg.filters)
    tune, held = halves(corpus(SHARED))
    if args.derive:
        from data_prep.thresholds import as_overrides

        for lang, values in as_overrides(derive_all(cfg, tune)).items():
            print(f"    {lang}: {{{', '.join(f'{k}: {json.dumps(v)}' for k, v in values.items())}}}")
        return
    for name, docs in (("tuning half", tune), ("held-out half", held)):
        report(f"clean text of {SHARED}, {name}", clean_drops(cfg, docs))
        kept = junk_kept(cfg, docs)
        print(f"  junk documents kept (built from the {name}): {len(kept)}")
        for lang, kind, text in kept[:20]:
            print(f"    {lang} {kind}: {text[:100]!r}")


if __name__ == "__main__":
    main()
