"""The shipped filter thresholds (configs/data/demo.yaml) on both sides: synthetic junk of four
kinds (data_prep/calibration/junk.py), built from every language's own text, is dropped; clean text is kept
— the sample corpus here, and with ../shared/corpus present, at most 1% of any language of a
source held out of the derivation (``python -m data_prep.calibration.filter_defaults`` prints the same figures).
The shipped values are what the derivation (data_prep/calibration/thresholds.py) gives, not hand edits."""

from pathlib import Path

import pytest

from bloomline.config import load_config
from data_prep.calibration.filter_defaults import corpus, derive_all, held_out_sources, in_sample
from data_prep.calibration.thresholds import as_overrides, derive
from data_prep.config import PrepareConfig, QualityThresholds

REPO = Path(__file__).resolve().parents[3]

SAMPLE = REPO / "data_prep" / "sample_corpus"


@pytest.fixture(scope="module")
def cfg():
    return load_config(PrepareConfig, REPO / "configs/data/demo.yaml")


def test_junk_is_dropped_and_clean_sample_corpus_kept(cfg):
    res = in_sample(cfg, corpus(SAMPLE))
    assert len(res) == 59
    assert not [(lang, kind, text[:80]) for lang, v in res.items() for kind, text in v.junk_kept]
    assert not {lang: dict(v.drops) for lang, v in res.items() if v.drops}


def test_the_derivation_rule():
    """A check that separates junk goes midway between the clean tail and the junk; one that does
    not goes 1.5 x the clean tail, never below the recipe's value."""
    clean = [{"char_rep": x / 100, "word_rep": x / 200, "special": 0.2, "keyboard": 0.0} for x in range(101)]
    junk = {
        "repeats": [{"char_rep": 0.05, "word_rep": 0.9, "special": 0.1, "keyboard": 0.0}] * 3,
        "mash": [{"char_rep": 0.0, "word_rep": 0.0, "special": 0.3, "keyboard": 0.8}],
    }
    got = derive(clean, junk, QualityThresholds(max_char_rep=0.5, max_special=0.4))
    assert got == {
        "max_word_rep": round((0.495 + 0.9) / 2, 3),  # tail 0.495 (99th percentile), junk 0.9
        "max_keyboard": 0.4,  # tail 0, mashing 0.8
        "max_char_rep": round(0.99 * 1.5, 3),  # no junk left to it: 1.5 x the tail
        "max_special": 0.4,
    }  # 1.5 x 0.2 = 0.3 is below the recipe's 0.4


def test_held_out_sources_lose_at_most_one_percent_per_language(cfg, shared_corpus):
    docs = corpus(shared_corpus)
    res = held_out_sources(cfg, docs)
    checked = {lang: v for lang, v in res.items() if v is not None}
    assert len(checked) >= 40  # every natural language with two or more sources
    over = {lang: (dict(v.drops), v.docs) for lang, v in checked.items() if sum(v.drops.values()) > 0.01 * v.docs}
    assert not over, over
    assert not [(lang, kind) for lang, v in checked.items() for kind, _ in v.junk_kept]
    # the shipped languages are the derivation from every source, as generated
    assert cfg.filters.languages == as_overrides(derive_all(cfg, docs))
