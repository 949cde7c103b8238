"""The vectorised character classes answer as the per-character predicates do (data_prep/steps/text.py)."""

import sys

import numpy as np

from data_prep.steps.text import (
    codepoints,
    count_special,
    from_codepoints,
    is_punct_or_symbol,
    is_special,
    punct_or_symbol_chars,
    special_table,
    unkept_table,
)


def test_every_code_point_classes_as_the_predicates_do():
    import unicodedata

    everything = range(sys.maxunicode + 1)
    assert special_table().tolist() == [is_special(chr(i)) for i in everything]
    assert unkept_table().tolist() == [unicodedata.category(chr(i))[0] in "PSZC" for i in everything]
    assert punct_or_symbol_chars() == {chr(i) for i in everything if is_punct_or_symbol(chr(i))}


def test_code_points_round_trip_and_count():
    text = "Ça va? 你好, 🙂 \t\u200b x1\ud800"  # a lone surrogate too: it counts as a character
    cps = codepoints(text)
    assert cps.dtype == np.uint32 and len(cps) == len(text)
    assert from_codepoints(cps) == text
    assert count_special(text) == sum(map(is_special, text))
