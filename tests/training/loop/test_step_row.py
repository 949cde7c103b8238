"""The layout of the row each rank all-gathers per step (training/loop/step_row.py)."""

import numpy as np
import pytest

from training.loop.step_row import StepRow
from training.planning.flops import balance_over_dp


def test_fields_read_back_by_name_from_gathered_rows():
    layout = StepRow(langs=2, feedback=3)
    rows = np.array(
        [
            layout.pack(
                dp_rank=dp,
                tp_rank=0,
                pp_rank=0,
                flops=10.0 * (dp + 1),
                forward_s=0.5,
                weights=7,
                lang_loss=[1.0 + dp, 2.0],
                lang_tokens=[3, 4],
                feedback=[dp, 8, 9],
            )
            for dp in range(2)
        ]
    )
    assert rows.shape == (2, layout.width) == (2, 6 + 2 * 2 + 3)
    assert layout.get(rows, "flops").tolist() == [10.0, 20.0]
    assert layout.get(rows, "lang_loss").sum(axis=0).tolist() == [3.0, 4.0]
    assert layout.get(rows, "lang_tokens")[0].tolist() == [3.0, 4.0]
    assert layout.get(rows, "feedback")[1].tolist() == [1.0, 8.0, 9.0]
    assert balance_over_dp(layout.by_rank(rows, "flops")) == pytest.approx(20 / 15)


def test_a_missing_field_or_a_wrong_length_is_refused():
    layout = StepRow(langs=2)
    full = dict(
        dp_rank=0,
        tp_rank=0,
        pp_rank=0,
        flops=1,
        forward_s=1,
        weights=0,
        lang_loss=[1, 2],
        lang_tokens=[1, 2],
        feedback=[],
    )
    assert len(layout.pack(**full)) == layout.width
    with pytest.raises(ValueError, match="weights"):
        layout.pack(**{k: v for k, v in full.items() if k != "weights"})
    with pytest.raises(ValueError, match="lang_tokens has 3 values"):
        layout.pack(**{**full, "lang_tokens": [1, 2, 3]})
