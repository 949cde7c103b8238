"""The skewed benchmark corpus's proportions (tests/support/skewed.py): ROOTS' table as written down."""

from tests.support.grow import SHARED
from tests.support.skewed import roots_shares, skewed_targets


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


def test_the_test_corpus_holds_every_language_and_no_training_text(tmp_path):
    import json

    from tests.support.grow import grow
    from tests.support.skewed import grow_test

    train, test = tmp_path / "train", tmp_path / "test"
    grow(train, 0, dup_rate=0.0, seed=0, targets={k: 1500 for k in roots_shares()})
    # seed 0 again: the same walks as training, so every test document is one training holds
    assert grow_test(test, train, 1.5, seed=0)["dropped_as_seen"] > 0
    assert all(f.read_text() == "" for f in test.glob("*.jsonl"))
    other = tmp_path / "other"
    s = grow_test(other, train, 1.5, seed=1)
    texts = {json.loads(l)["text"] for f in train.glob("*.jsonl") for l in f.read_text().splitlines()}
    held = [json.loads(l) for f in other.glob("*.jsonl") for l in f.read_text().splitlines()]
    assert {r["lang"] for r in held} == {
        r["lang"] for f in train.glob("*.jsonl") for r in map(json.loads, f.read_text().splitlines())
    }
    assert not any(r["text"] in texts for r in held) and s["dropped_as_seen"] < len(held) // 10
