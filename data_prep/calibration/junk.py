"""Synthetic junk that the shipped filter thresholds must drop in every language (the other side
of "defaults that keep clean text": tests/data_prep/calibration/test_filter_defaults.py, data_prep/calibration/filter_defaults.py).

Each generator takes a clean text of the language (so the junk is in the language's own script
and words, and passes language ID) and returns a document of one kind:

* ``repeated_lines``: one line of the text, repeated as the whole document (scraped list pages);
* ``keyboard_mash``: runs along a keyboard row, with spaces ("asdfgh jkl asdf"), with a few
  words of the language around them;
* ``boilerplate_menu``: navigation menus, the same items (words of the text) joined by ``|`` on
  every line, as scraped site chrome;
* ``one_sentence``: a document that is 90% one repeated sentence, the rest the text's own.
"""

from __future__ import annotations

import random
import re
from typing import Callable

ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _sentences(text: str) -> list[str]:
    parts = [p.strip() for p in re.split(r"(?<=[.!?。！？।])\s*", text) if len(p.strip()) > 20]
    return parts or [text.strip()[:200]]


def repeated_lines(text: str, rng: random.Random) -> str:
    line = rng.choice(_sentences(text))
    return "\n".join([line] * 30)


def keyboard_mash(text: str, rng: random.Random) -> str:
    words = text.split()
    out = []
    for _ in range(60):
        row = rng.choice(ROWS)
        a = rng.randrange(len(row) - 3)
        out.append(row[a : a + rng.randint(3, len(row) - a)])
    for _ in range(5):
        out.insert(rng.randrange(len(out)), rng.choice(words))
    return " ".join(out)


def boilerplate_menu(text: str, rng: random.Random) -> str:
    words = [w for w in text.split() if len(w) > 2] or text.split()
    items = rng.sample(words, min(6, len(words)))
    return "\n".join(" | ".join(items) for _ in range(20))


def one_sentence(text: str, rng: random.Random) -> str:
    ss = _sentences(text)
    s = rng.choice(ss)
    body = " ".join([s] * 27)
    rest = " ".join(ss)[: max(1, len(body) // 9)]
    return body + " " + rest


KINDS: dict[str, Callable[[str, random.Random], str]] = {
    "repeated_lines": repeated_lines,
    "keyboard_mash": keyboard_mash,
    "boilerplate_menu": boilerplate_menu,
    "one_sentence": one_sentence,
}
