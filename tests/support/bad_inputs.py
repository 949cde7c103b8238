"""A JSONL input file with one record of every kind ``prepare`` must drop with its reason
(malformed JSON, invalid UTF-8, a missing or empty text, a line over the size limit, binary junk,
an unknown or missing language, …) beside one good record: :func:`write_bad_inputs` writes it and
returns each reason's line. For the tests of prepare's drop log and of its runs on bad inputs
(tests/conftest.py's ``bad_inputs`` fixture hands it to the rest)."""

from __future__ import annotations

import json
from pathlib import Path


def write_bad_inputs(path: Path) -> dict[str, str]:
    """A JSONL file with one of every kind of bad record; returns {reason: expected line}."""
    good = {
        "id": "ok-1",
        "text": "A perfectly ordinary English sentence, long enough to pass every filter we apply here today, "
        "written for the bad input test of bloomline so that one good record sits among the bad ones.",
        "lang": "en",
    }
    lines = [
        json.dumps(good).encode(),  # 1 good
        b'{"id": "x", "text": "unterminated',  # 2 malformed_json
        b'{"id": "y", "text": "caf\xe9 au lait", "lang": "fr"}',  # 3 invalid_utf8 (latin-1 byte)
        json.dumps({"id": "z", "lang": "en"}).encode(),  # 4 missing_text
        json.dumps({"id": "e", "text": "   ", "lang": "en"}).encode(),  # 5 empty_text
        json.dumps({"id": "big", "text": "a" * (20 * 1024 * 1024), "lang": "en"}).encode(),  # 6 too_long (20 MB line)
        bytes(b for b in range(256) if b != 10) * 4,  # 7 binary junk
        json.dumps({"id": "u", "text": "some text here", "lang": "xx-unknown"}).encode(),  # 8 unknown_lang
        json.dumps(["not", "an", "object"]).encode(),  # 9 not_an_object
        json.dumps({"id": "n", "text": 42, "lang": "en"}).encode(),  # 10 text_not_string
        json.dumps({"id": "s", "text": "bad \ud800 surrogate", "lang": "en"}).encode(),  # 11 invalid_unicode
        json.dumps({"id": "m", "text": "no language label"}).encode(),  # 12 missing_lang
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return {
        "malformed_json": 2,
        "invalid_utf8": 3,
        "missing_text": 4,
        "empty_text": 5,
        "too_long": 6,
        "unknown_lang": 8,
        "not_an_object": 9,
        "text_not_string": 10,
        "invalid_unicode": 11,
        "missing_lang": 12,
    }
