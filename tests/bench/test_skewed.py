"""The skewed benchmark corpus's proportions (bench/skewed.py): ROOTS' table as written down."""

from bench.grow import SHARED
from bench.skewed import roots_shares, skewed_targets


def test_every_language_of_the_corpus_has_its_roots_share():
    shares = roots_shares()
    assert sorted(shares) == sorted(f.stem for f in SHARED.rglob("*.jsonl"))  # the 46 + 13 of ../shared/corpus
    assert abs(sum(shares.values()) - 1) < 1e-12
    order = sorted(shares, key=shares.get)
    assert order[0] == "tum" and order[-1] == "en" and 0.29 < shares["en"] < 0.31  # ROOTS: ~30% English
    assert shares["ak"] < shares["ny"] < shares["ig"] < shares["sw"]  # the misprinted entries in their place


def test_targets_keep_the_proportions_above_the_floor():
    t = skewed_targets(64, 32)
    s = roots_shares()
    assert min(t.values()) == 32_000 and t["en"] == int(64e6 * s["en"])
    above = [k for k in t if t[k] > 32_000]
    assert all(abs(t[a] / t[b] - s[a] / s[b]) < 1e-3 * s[a] / s[b] for a in above for b in above)
