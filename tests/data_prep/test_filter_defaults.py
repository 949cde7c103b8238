"""The shipped filter thresholds (configs/data/demo.yaml) on both sides: synthetic junk of four
kinds (data_prep/junk.py), built from every language's own text, is dropped; clean text is kept
— the sample corpus here, and every language of ../shared/corpus (at most 1% dropped) when it is
present (bench/filter_defaults.py prints the same figures)."""

import sys
from pathlib import Path

import pytest

from bloomline.config import load_config
from data_prep.config import PrepareConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.filter_defaults import clean_drops, junk_kept  # noqa: E402

SAMPLE = REPO / "data_prep" / "sample_corpus"


@pytest.fixture(scope="module")
def cfg():
    return load_config(PrepareConfig, REPO / "configs/data/demo.yaml")


def test_junk_is_dropped_in_every_language(cfg):
    kept = junk_kept(cfg, SAMPLE)
    assert not kept, [(lang, kind, text[:80]) for lang, kind, text in kept[:10]]


def test_clean_sample_corpus_is_kept(cfg):
    drops = {lang: (n, c) for lang, (n, c) in clean_drops(cfg, SAMPLE).items() if sum(c.values())}
    assert not drops, drops


def test_clean_shared_corpus_loses_at_most_one_percent_per_language(cfg, shared_corpus):
    res = clean_drops(cfg, shared_corpus)
    over = {lang: (sum(c.values()), n, dict(c)) for lang, (n, c) in res.items() if sum(c.values()) > 0.01 * n}
    assert len(res) == 59 and not over, over
    assert not junk_kept(cfg, shared_corpus, per_lang=1)
