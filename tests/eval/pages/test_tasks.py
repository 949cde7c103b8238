"""The task pages' numbers (eval/pages/tasks.py)."""

import random

import pytest
from scipy.stats import spearmanr

from eval.pages.tasks import spearman


def test_spearman_is_scipy_s_ties_included():
    rng = random.Random(0)
    for n in (3, 4, 7, 20):
        steps = sorted(rng.sample(range(1000), n))
        for values in ([rng.random() for _ in range(n)], [rng.choice([0.25, 0.5, 0.75]) for _ in range(n)]):
            if len(set(values)) < 2:
                continue
            assert spearman(steps, values) == pytest.approx(spearmanr(steps, values).statistic, abs=1e-12)
    assert spearman([1, 2, 3], [0.1, 0.2, 0.3]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [0.5, 0.5, 0.5]) is None and spearman([1, 2], [0.1, 0.2]) is None
