"""Per-language rows and their group aggregates (eval/results/metrics.py), languages BLOOM never saw included."""

import math

import pytest

from eval.results.metrics import LangTotals, metric_rows


def test_languages_outside_blooms_are_the_group_added_beside_blooms_groups():
    per_lang = {
        lang: LangTotals(nll=n * math.log(2) * 100, tokens=100, text_nll=n * math.log(2) * 100, bytes=100, docs=2)
        for lang, n in (("sw", 1.0), ("de", 2.0), ("th", 4.0), ("code-python", 3.0))
    }
    rows = metric_rows(per_lang, {"de": 7})
    family = {r["lang"]: r["family"] for r in rows if r["scope"] == "language"}
    assert family == {"sw": "niger-congo", "de": "added", "th": "added", "code-python": "code"}
    groups = {(r["lang"], r["weighting"]): r for r in rows if r["scope"] == "group"}
    assert sorted({g for g, _ in groups}) == ["added", "code", "niger-congo"]  # groups with no language: no row
    added = groups["added", "mean"]
    assert added["bpb"] == pytest.approx(3.0) and added["docs"] == 4 and added["tokens_seen"] == 7
    assert [r["lang"] for r in rows if r["scope"] != "language"][-2:] == ["all", "all"]  # overall last
