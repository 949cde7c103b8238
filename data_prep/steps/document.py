"""The unit that flows between steps, and the ledger that accounts for every one of them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import xxhash

from bloomline.errors import DataError


def uniform_draw(seed: int, salt: str, doc_id: str, exact: int) -> float:
    """A document's uniform draw in [0, 1) for one purpose (``salt``): stable for the same seed,
    id and text (``exact``: its exact-dedup hash), whatever the corpus order or other documents."""
    return xxhash.xxh64_intdigest(f"{seed}:{salt}:{doc_id}:{exact}".encode()) / 2.0**64


# Records whose language cannot be known (malformed line, missing or unknown label) are booked
# under this key, so the ledger still balances.
UNKNOWN_LANG = "_unknown"


@dataclass(slots=True)
class Document:
    text: str
    """Document text (after normalization: NFC, no control characters)."""
    lang: str
    """Canonical language code (bloomline.languages)."""
    id: str
    """Id from the record's id field, else its location."""
    loc: str
    """Where it came from: ``path:line`` (JSONL) or ``path:row N`` (Parquet/Arrow)."""
    pos: int = 0
    """Position within its chunk, in input order."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Per-step annotations (language-ID score, hashes)."""


class StrictModeError(DataError):
    """Raised instead of booking an error when ``--strict`` is on."""


OUTCOMES = ("filtered", "duplicates", "errors")


class Ledger:
    """Per-language accounting: every input record ends kept, filtered:reason,
    duplicate:kind or error:reason — the invariant checked by :meth:`check_balance`:

        docs_in = docs_kept + Σ filtered + Σ duplicates + Σ errors   (per language)

    It also keeps the first location per error reason (``file:line``) as an example, the
    bytes/tokens of kept documents and PII counts. Ledgers of chunks are merged in chunk order,
    so examples are the first in input order and the result is deterministic.
    """

    def __init__(self, log: Any = None, strict: bool = False) -> None:
        self.langs: dict[str, dict[str, Any]] = {}
        self.log = log
        """The unit of work's ``data_prep.storage.droplog.DropLog`` (rows of dropped documents), or None."""
        self.strict = strict
        """An error stops the run instead of being booked (the recipe's ``strict``, ``--strict``)."""

    def _entry(self, lang: str) -> dict[str, Any]:
        e = self.langs.get(lang)
        if e is None:
            e = self.langs[lang] = {
                "docs_in": 0,
                "docs_kept": 0,
                "filtered": Counter(),
                "duplicates": Counter(),
                "errors": Counter(),
                "error_examples": {},
                "tokens": 0,
                "bytes": 0,
                "pii": Counter(),
            }
        return e

    def record_in(self, lang: str, n: int = 1) -> None:
        self._entry(lang)["docs_in"] += n

    def drop(self, lang: str, outcome: str, reason: str, loc: str | None = None, n: int = 1) -> None:
        assert outcome in OUTCOMES, outcome
        e = self._entry(lang)
        e[outcome][reason] += n
        if outcome == "errors" and loc is not None:
            e["error_examples"].setdefault(reason, loc)

    def keep(self, lang: str, n_bytes: int, n_tokens: int) -> None:
        e = self._entry(lang)
        e["docs_kept"] += 1
        e["bytes"] += n_bytes
        e["tokens"] += n_tokens

    def pii(self, lang: str, kind: str, n: int) -> None:
        if n:
            self._entry(lang)["pii"][kind] += n

    def merge(self, other: "Ledger | dict") -> None:
        langs = other.langs if isinstance(other, Ledger) else other
        for lang, o in langs.items():
            e = self._entry(lang)
            for k in ("docs_in", "docs_kept", "tokens", "bytes"):
                e[k] += o.get(k, 0)
            for k in ("filtered", "duplicates", "errors", "pii"):
                e[k].update(o.get(k, {}))
            for reason, loc in o.get("error_examples", {}).items():
                e["error_examples"].setdefault(reason, loc)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for lang in sorted(self.langs):
            e = self.langs[lang]
            out[lang] = {k: (dict(sorted(v.items())) if isinstance(v, (Counter, dict)) else v) for k, v in e.items()}
        return out

    def totals(self) -> dict[str, int]:
        t = Counter()
        for e in self.langs.values():
            t["docs_in"] += e["docs_in"]
            t["docs_kept"] += e["docs_kept"]
            for k in OUTCOMES:
                t[k] += sum(e[k].values())
        return dict(t)

    def check_balance(self) -> list[str]:
        """Languages whose books do not balance (empty list: all balance)."""
        bad = []
        for lang, e in self.langs.items():
            out = e["docs_kept"] + sum(sum(e[k].values()) for k in OUTCOMES)
            if out != e["docs_in"]:
                bad.append(f"{lang}: docs_in={e['docs_in']} but kept+filtered+duplicates+errors={out}")
        return bad
