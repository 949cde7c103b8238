"""Per-language quality thresholds derived from each language's own score distributions.

Hand-set constants fit the corpus they were set on: ROOTS' word-repetition limit of 0.3 drops 6%
of clean Fon news written a numbered sentence per line. FineWeb-2 instead sets each language's
thresholds from statistics of that language's reference text. Here, per natural language, from
the scores (data_prep/steps/filters.py) of a clean reference sample and of synthetic junk built from
that same sample (data_prep/calibration/junk.py):

* the clean tail ``t``: the 99th percentile of the clean scores;
* each kind of junk is left to the check that separates it from the clean text by the widest
  ratio (its lowest score over the clean tail: word repetition for repeated lines, menus and
  one-sentence pages, 0.83 against 0.02–0.23; keyboard runs for mashing, 0.92 against 0.1), and
  that check goes **midway between the clean tail and the lowest score of its junk**: the
  largest margin to either side that this evidence allows;
* a check that separates no junk goes to ``t·(1 + MARGIN)``: room above the clean tail for
  genres the sample lacks, and never stricter than the recipe's value (ROOTS' per-language
  choice or its default), which stays its floor. (The midway value has no floor: where ROOTS was
  lax, as Chinese's word repetition at 0.96, the junk would pass.) Lengths (``min_words``) and
  flagged-word limits are the recipe's.

``python -m data_prep.calibration.filter_defaults --derive`` applies this to every source of ../shared/corpus and
prints the result for ``configs/data/demo.yaml``. The same bench checks the rule on text from
other sources: per language, each source in turn is held out, the thresholds derived from the
others, and the held-out source's drop rate reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from data_prep.config import QualityThresholds
from data_prep.steps import filters

ROOTS: dict[str, dict[str, Any]] = {
    # BigScience's per-language parameters for ROOTS (bigscience-workshop/data-preparation,
    # preprocessing/training/01b_oscar_cleaning_and_filtering/parameters_filtering.py); the others
    # use QualityThresholds' defaults, which are ROOTS' defaults. min_words is capped at 20: ROOTS'
    # values assume OSCAR web pages, and short clean documents should not go for length alone.
    "ar": {"min_words": 20, "max_char_rep": 0.20, "max_word_rep": 0.34, "max_special": 0.30, "max_flagged": 0.03},
    "bn": {"min_words": 20, "max_char_rep": 0.13, "max_word_rep": 0.21, "max_special": 0.45, "max_flagged": 0.001},
    "ca": {"min_words": 15, "max_char_rep": 0.20, "max_word_rep": 0.40, "max_special": 0.25},
    "en": {
        "min_words": 20,
        "max_char_rep": 0.106,
        "max_word_rep": 0.19,
        "max_special": 0.40,
        "max_flagged": 0.01,
        "flagged_words": [
            "porn",
            "porno",
            "xxx",
            "camgirl",
            "camgirls",
            "escort",
            "escorts",
            "hentai",
            "nsfw",
            "viagra",
        ],
    },
    "es": {
        "min_words": 16,
        "max_char_rep": 0.14,
        "max_word_rep": 0.25,
        "max_special": 0.34,
        "max_flagged": 0.01,
        "flagged_words": ["porno", "xxx", "escort", "escorts", "putas", "webcam", "viagra"],
    },
    "eu": {"min_words": 8, "max_char_rep": 0.20, "max_word_rep": 0.40, "max_special": 0.31},
    "fr": {
        "min_words": 13,
        "max_char_rep": 0.14,
        "max_word_rep": 0.13,
        "max_special": 0.34,
        "max_flagged": 0.008,
        "flagged_words": ["porno", "xxx", "escort", "escorts", "salope", "salopes", "viagra"],
    },
    "hi": {"min_words": 20, "max_char_rep": 0.18, "max_word_rep": 0.47, "max_special": 0.45, "max_flagged": 0.005},
    "id": {"min_words": 15, "max_char_rep": 0.15, "max_word_rep": 0.20, "max_special": 0.34, "max_flagged": 0.01},
    "pt": {
        "min_words": 19,
        "max_char_rep": 0.25,
        "max_word_rep": 0.98,
        "max_special": 0.35,
        "max_flagged": 0.007,
        "flagged_words": ["porno", "xxx", "escort", "escorts", "putas", "viagra"],
    },
    "ur": {
        "min_words": 20,
        "max_char_rep": 0.19,
        "word_rep_n": 7,
        "max_word_rep": 0.50,
        "max_special": 0.25,
        "max_flagged": 0.025,
    },
    "vi": {"min_words": 20, "max_char_rep": 0.15, "max_word_rep": 0.20, "max_special": 0.34, "max_flagged": 0.005},
    "zh-Hans": {
        "min_words": 1,
        "char_rep_n": 3,
        "max_char_rep": 0.2,
        "max_word_rep": 0.96,
        "max_special": 0.3,
        "max_flagged": 0.001,
    },
    "zh-Hant": {
        "min_words": 1,
        "char_rep_n": 3,
        "max_char_rep": 0.2,
        "max_word_rep": 0.96,
        "max_special": 0.3,
        "max_flagged": 0.001,
    },
}
"""The hand-set base the derivation starts from: n-gram sizes, lengths and flagged words, and the
floor of the ratio checks that catch no junk."""
TAIL = 0.99
"""Quantile of the clean scores taken as the language's tail."""
MARGIN = 0.5
"""Room above the clean tail for checks no junk relies on."""
CHECKS = {c.score: c.limit for c in filters.CHECKS if c.derived}
"""The checks derived here (data_prep/steps/filters.py ``Check.derived``): score name → threshold field."""


def derive(
    clean: list[dict[str, float]], junk: dict[str, list[dict[str, float]]], recipe: QualityThresholds
) -> dict[str, float]:
    """The derived thresholds of one language (threshold field → value, rounded to 3 decimals)
    from its clean scores and its junk scores by kind."""
    tail = {score: float(np.quantile([s[score] for s in clean], TAIL)) for score in CHECKS}
    catches: dict[str, list[float]] = {}  # check → lowest scores of the junk kinds left to it
    for docs in junk.values():
        if not docs:
            continue
        lowest = {score: min(s[score] for s in docs) for score in CHECKS}
        ratio = {score: lowest[score] / max(tail[score], 1e-3) for score in CHECKS}
        best = max(CHECKS, key=lambda score: ratio[score])
        if ratio[best] > 1:
            catches.setdefault(best, []).append(lowest[best])
    out: dict[str, float] = {}
    for score, field in CHECKS.items():
        if score in catches:
            value = (tail[score] + min(catches[score])) / 2
        else:
            value = max(tail[score] * (1 + MARGIN), float(getattr(recipe, field)))
        out[field] = round(value, 3)
    return out


def base(lang: str, defaults: QualityThresholds) -> QualityThresholds:
    """``defaults`` with the language's ROOTS parameters."""
    from bloomline.config import from_dict, to_dict

    return from_dict(QualityThresholds, {**to_dict(defaults), **ROOTS.get(lang, {})})


def as_overrides(derived: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """``filters.languages`` of a recipe: each language's ROOTS parameters with the derived values."""
    return {lang: {**ROOTS.get(lang, {}), **values} for lang, values in sorted(derived.items())}
