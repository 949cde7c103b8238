import random

import numpy as np
import pytest

from data_prep.config import DedupConfig
from data_prep.dedup import Deduplicator, exact_key, minhash, shingles


def doc_with_jaccard(base_words: list[str], target: float, rng: random.Random) -> tuple[str, float]:
    """Change trailing words of a document until its 1-gram-shingle Jaccard with base is ~target."""
    words = list(base_words)
    a = set(base_words)
    for i in range(len(words) - 1, -1, -1):
        words[i] = f"zz{rng.randrange(10**9)}"
        j = len(a & set(words)) / len(a | set(words))
        if j <= target:
            return " ".join(words), j
    raise AssertionError


def test_exact_normalization():
    assert exact_key("Hello, World!") == exact_key("hello   world")
    assert exact_key("hello world") != exact_key("hello world 2")


def test_near_duplicates_at_the_threshold():
    rng = random.Random(0)
    cfg = DedupConfig(threshold=0.8, num_perm=256, shingle_words=1)
    base = [f"w{i}" for i in range(400)]
    above, j_above = doc_with_jaccard(base, 0.9, rng)
    below, j_below = doc_with_jaccard(base, 0.6, rng)
    assert j_above >= 0.85 and j_below <= 0.65
    d = Deduplicator(cfg)
    sig = lambda t: minhash(t, cfg, han=False)
    assert d.check(exact_key(" ".join(base)), sig(" ".join(base)), ref=10) is None
    kind, ref, similarity = d.check(exact_key(above), sig(above), ref=11)
    assert (kind, ref) == ("near", 10) and similarity == pytest.approx(j_above, abs=0.06) and similarity >= 0.8
    assert d.check(exact_key(below), sig(below), ref=12) is None
    assert d.check(exact_key(" ".join(base)), sig(" ".join(base)), ref=13) == ("exact", 10, 1.0)


def test_switches():
    cfg = DedupConfig(exact=False, near=False)
    d = Deduplicator(cfg)
    assert d.check(1, None) is None and d.check(1, None) is None
    cfg = DedupConfig(near=False)
    d = Deduplicator(cfg)
    assert d.check(1, None, ref=5) is None and d.check(1, None, ref=6) == ("exact", 5, 1.0)


def test_han_shingles_are_characters():
    s = shingles("我们今天去市场买菜", 3, han=True)
    assert "我们今".encode() in s and len(s) == 7


def test_signature_is_deterministic():
    cfg = DedupConfig()
    a = minhash("one two three four five six seven", cfg, han=False)
    assert np.array_equal(a, minhash("one two three four five six seven", cfg, han=False))
    assert a.dtype == np.uint32 and len(a) == cfg.num_perm
