"""The manifest's language blend (data_prep/passes/manifest.py): α-smoothed training tokens by default,
the recipe's weights renormalised over the languages with data when given, and a one-line error
for weights that name a language without data or give none any weight."""

import pytest

from bloomline.config import from_dict
from bloomline.errors import DataError
from data_prep.config import PrepareConfig
from data_prep.passes.manifest import blend_weights

TOKENS = {"en": 900, "fr": 100, "sw": 0}


def test_alpha_blend_lifts_the_small_language():
    w = blend_weights(from_dict(PrepareConfig, {"blend": {"alpha": 0.5}}), TOKENS)
    assert set(w) == {"en", "fr"}  # no data, no weight
    assert w["fr"] == pytest.approx(0.1**0.5 / (0.9**0.5 + 0.1**0.5), abs=1e-8) and w["fr"] > 0.1
    assert blend_weights(from_dict(PrepareConfig, {"blend": {"alpha": 1.0}}), TOKENS) == {"en": 0.9, "fr": 0.1}


def test_recipe_weights():
    cfg = from_dict(PrepareConfig, {"blend": {"weights": {"en": 1, "fr": 3}}})
    assert blend_weights(cfg, TOKENS) == {"en": 0.25, "fr": 0.75}
    with pytest.raises(DataError, match="sw"):
        blend_weights(from_dict(PrepareConfig, {"blend": {"weights": {"sw": 1, "en": 1}}}), TOKENS)
    with pytest.raises(DataError, match="no weight"):
        blend_weights(from_dict(PrepareConfig, {"blend": {"weights": {"en": 0, "fr": 0}}}), TOKENS)
