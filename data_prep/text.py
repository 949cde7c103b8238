"""Character classes and word splitting shared by the quality filters and deduplication."""

from __future__ import annotations

import string
import unicodedata
from functools import lru_cache
from typing import Callable

_ASCII_SPECIAL = set(string.punctuation + string.digits + string.whitespace)


@lru_cache(maxsize=65536)
def is_special(ch: str) -> bool:
    """ROOTS' "special character": punctuation, digits, whitespace, symbols (emoji included) and
    format characters (Unicode categories P*, S*, Z*, Nd, Cf)."""
    if ch in _ASCII_SPECIAL:
        return True
    cat = unicodedata.category(ch)
    return cat[0] in "PSZ" or cat == "Nd" or cat == "Cf"


def is_punct_or_symbol(ch: str) -> bool:
    """Punctuation or symbol (Unicode P*, S*); digits are not."""
    return unicodedata.category(ch)[0] in "PS"


def is_han(ch: str) -> bool:
    """A Han ideograph (CJK Unified Ideographs, extension A, B–F, compatibility ideographs)."""
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FFFF or 0xF900 <= o <= 0xFAFF


def strip_edges(word: str, edge: Callable[[str], bool]) -> str:
    """``word`` without the characters at either end for which ``edge`` holds (ROOTS strips
    special characters from both ends of each word)."""
    i, j = 0, len(word)
    while i < j and edge(word[i]):
        i += 1
    while j > i and edge(word[j - 1]):
        j -= 1
    return word[i:j]
