"""Character classes and word splitting shared by the quality filters and deduplication."""

from __future__ import annotations

import re
import string
import sys
import unicodedata
from functools import lru_cache
from typing import Callable, Iterable

import numpy as np

_ASCII_SPECIAL = set(string.punctuation + string.digits + string.whitespace)


@lru_cache(maxsize=65536)
def is_special(ch: str) -> bool:
    """ROOTS' "special character": punctuation, digits, whitespace, symbols (emoji included) and
    format characters (Unicode categories P*, S*, Z*, Nd, Cf)."""
    return ch in _ASCII_SPECIAL or _special_category(unicodedata.category(ch))


def _special_category(cat: str) -> bool:
    return cat[0] in "PSZ" or cat == "Nd" or cat == "Cf"


def is_punct_or_symbol(ch: str) -> bool:
    """Punctuation or symbol (Unicode P*, S*); digits are not."""
    return _punct_or_symbol_category(unicodedata.category(ch))


def _punct_or_symbol_category(cat: str) -> bool:
    return cat[0] in "PS"


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


# -- whole-text character classes, vectorised ------------------------------------------------
# The per-character predicates above cost a Python call per character (~10 MB/s). For what is
# counted or removed over a whole text, the text goes to numpy as code points and a table of
# every code point's class answers at once (~100 MB/s). The tables come from the same
# ``unicodedata`` as the predicates (the `regex` module's \p{..} classes would be faster still,
# but follow a newer Unicode version than this Python's, so new characters would class
# differently), so the answers are the same character for character.


def codepoints(text: str) -> np.ndarray:
    """The text's code points as uint32 (lone surrogates included, as code points)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def from_codepoints(cps: np.ndarray) -> str:
    return cps.astype(np.uint32, copy=False).tobytes().decode("utf-32-le", "surrogatepass")


@lru_cache(maxsize=1)
def _category_tables() -> tuple[np.ndarray, tuple[str, ...]]:
    """(index of each code point's Unicode category, the categories); ~0.15 s once per process."""
    # every category is two ASCII letters: all of them as one string, read back as uint16 pairs
    pairs = "".join(map(unicodedata.category, map(chr, range(sys.maxunicode + 1)))).encode("ascii")
    codes, index = np.unique(np.frombuffer(pairs, dtype=np.uint16), return_inverse=True)
    names = tuple(int(c).to_bytes(2, "little").decode("ascii") for c in codes)
    return index.astype(np.uint8), names


def category_table(pred: Callable[[str], bool], extra: str = "") -> np.ndarray:
    """A bool per code point: ``pred(category)``, or the code point is in ``extra``."""
    cat, names = _category_tables()
    table = np.array([pred(c) for c in names], dtype=bool)[cat]
    table[[ord(c) for c in extra]] = True
    return table


@lru_cache(maxsize=1)
def special_table() -> np.ndarray:
    """:func:`is_special` of every code point."""
    return category_table(_special_category, extra="".join(_ASCII_SPECIAL))


@lru_cache(maxsize=1)
def special_chars() -> frozenset[str]:
    """Every :func:`is_special` character (~9,000): ``ch in special_chars()`` is a set lookup,
    where a word loop asks of each word's first and last character."""
    return frozenset(map(chr, np.flatnonzero(special_table())))


def char_class(chars: Iterable[str]) -> re.Pattern:
    """A regex matching one character of ``chars`` (as ranges of consecutive code points: a
    class of thousands of characters compiles to a table, one lookup a character)."""
    cps, parts = sorted(map(ord, chars)), []
    i = 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        a, b = re.escape(chr(cps[i])), re.escape(chr(cps[j]))
        parts.append(a if i == j else f"{a}-{b}")
        i = j + 1
    return re.compile(f"[{''.join(parts)}]")


@lru_cache(maxsize=1)
def special_re() -> re.Pattern:
    """One :func:`is_special` character."""
    return char_class(special_chars())


HAN_RE = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002ffff\uf900-\ufaff]")
"""One Han ideograph (the ranges of :func:`is_han`)."""

UNSPACED_SCRIPTS = frozenset({"Hans", "Hant", "Jpan", "Thai", "Mymr", "Khmr", "Laoo", "Tibt"})
"""ISO 15924 scripts written without spaces between words."""
UNSPACED_RE = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002ffff\uf900-\ufaff"  # Han (Japanese writes kanji too)
    "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # Hiragana, Katakana (and its extensions, half-width forms)
    "\u0e00-\u0eff\u1780-\u17ff\u19e0-\u19ff\u1000-\u109f\ua9e0-\ua9ff\uaa60-\uaa7f\u0f00-\u0fff]"
    # Thai, Lao; Khmer (and its symbols); Myanmar (and extensions A, B); Tibetan
)
"""One letter of a script written without spaces (:data:`UNSPACED_SCRIPTS`)."""


def unspaced_letters(script: str) -> "re.Pattern[str] | None":
    """For a script written without spaces, the letters whose words count each letter as a word
    (the quality checks' words, :func:`data_prep.steps.scores.words`); None for a spaced script.
    Chinese: Han alone, as its thresholds were fitted; the others: their own letters, and Han."""
    if script in ("Hans", "Hant"):
        return HAN_RE
    return UNSPACED_RE if script in UNSPACED_SCRIPTS else None


@lru_cache(maxsize=1)
def punct_or_symbol_chars() -> frozenset[str]:
    """Every :func:`is_punct_or_symbol` character."""
    return frozenset(map(chr, np.flatnonzero(category_table(_punct_or_symbol_category))))


@lru_cache(maxsize=1)
def unkept_table() -> np.ndarray:
    """Punctuation, symbols, separators and controls (categories P*, S*, Z*, C*): what the exact
    deduplication key leaves out."""
    return category_table(lambda c: c[0] in "PSZC")


def count_special(text: str) -> int:
    """How many characters of ``text`` are :func:`is_special`."""
    return int(np.count_nonzero(special_table()[codepoints(text)]))
