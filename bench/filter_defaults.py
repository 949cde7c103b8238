"""What the shipped filter thresholds drop of clean text, and whether they still drop junk
(run by hand; prints figures; tests/data_prep/test_filter_defaults.py pins both sides).

    python bench/filter_defaults.py [--config configs/data/demo.yaml] [--set en.max_char_rep=0.106 ...]

Clean text: every document of ../shared/corpus (news, declarations, classification sentences in
BLOOM's 46 natural languages; code in its 13 programming languages), normalised as ``prepare``
does, through the language-ID and quality steps with the config's thresholds. Target: at most
1% of any language dropped. Junk: data_prep/junk.py's four kinds built from each language's own
text (3 documents each); every one must be dropped.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO))


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


def corpus(root: Path) -> dict[str, list[tuple[str, str, str]]]:
    from bloomline import languages

    out: dict[str, list[tuple[str, str, str]]] = {}
    for f in sorted(root.rglob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            lang = languages.resolve(r["lang"]) or languages.resolve(f"code-{r['lang']}")
            out.setdefault(lang, []).append((r["id"], r["text"], lang))
    return out


def clean_drops(cfg: Any, root: Path) -> dict[str, tuple[int, Counter]]:
    """Per language: (documents, drops by reason) of the clean corpus."""
    res = {}
    for lang, docs in corpus(root).items():
        got = run_steps(cfg, docs).get(lang, Counter())
        res[lang] = (len(docs), Counter({k: v for k, v in got.items() if k != "kept"}))
    return res


def junk_kept(cfg: Any, root: Path, per_lang: int = 3) -> list[tuple[str, str, str]]:
    """(language, junk kind, text) of every junk document that was *not* dropped."""
    from bloomline import languages
    from data_prep.junk import KINDS

    rng = random.Random(0)
    kept = []
    for lang, docs in corpus(root).items():
        if languages.BY_CODE[lang].kind == "code":
            continue
        for _, text, _ in docs[:per_lang]:
            for kind, make in KINDS.items():
                junk = make(text, rng)
                got = run_steps(cfg, [("junk", junk, lang)]).get(lang, Counter())
                if got.get("kept"):
                    kept.append((lang, kind, junk))
    return kept


def main() -> None:
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.filter_report import parse_set

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=REPO / "configs/data/demo.yaml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    cfg = load_config(PrepareConfig, args.config)
    if args.sets:
        cfg.filters = parse_set(args.sets, cfg.filters)
    res = clean_drops(cfg, SHARED)
    worst = sorted(res.items(), key=lambda kv: -sum(kv[1][1].values()) / kv[1][0])
    print(f"clean text of {SHARED}: {sum(n for n, _ in res.values()):,} documents, {len(res)} languages")
    for lang, (n, c) in worst:
        d = sum(c.values())
        if d:
            print(f"  {lang:10s} {d:4d}/{n:4d} dropped ({100 * d / n:5.2f}%){'  > 1%' if d > 0.01 * n else ''}: "
                  + ", ".join(f"{k} {v}" for k, v in c.most_common()))
    over = [lang for lang, (n, c) in res.items() if sum(c.values()) > 0.01 * n]
    print(f"languages over 1%: {len(over)} {over}")
    kept = junk_kept(cfg, SHARED)
    print(f"junk documents kept: {len(kept)}")
    for lang, kind, text in kept[:20]:
        print(f"  {lang} {kind}: {text[:100]!r}")


if __name__ == "__main__":
    main()
