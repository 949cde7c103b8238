"""The drop log: one row per document that did not reach the shards (``DIR/dropped/``), and the
filter scores of every document the quality filter checked (``DIR/scores/``).

Both are Parquet datasets (a folder of Parquet files of one schema; ``pyarrow.dataset`` and
``datasets.load_dataset("parquet", ...)`` read them), written one file per unit of work and
before that unit's completion marker, in input order, so they are byte-identical between an
uninterrupted run and a killed-and-resumed one, like the shards:

* ``dropped/chunk-cNNNNNN.parquet``: what the chunks pass dropped (read errors, normalisation
  errors, language-ID and quality filters);
* ``dropped/dedup-cNNNNNN.parquet``: the duplicates the dedup pass found among chunk N's documents;
* ``dropped/pack-<lang>-pNNNNN.parquet``: documents of a pack part that PII redaction or the
  tokenizer failed on (errors ``pii.<exception>``, ``tokenize.<exception>``);
* ``scores/cNNNNNN.parquet``: the quality filter's scores (data_prep/steps/filters.py ``SCORES``) of
  every document it checked, kept or dropped, and the reason it dropped it (null: kept).

Why keep rows rather than counts: a data team's first question after a run is *which* documents
a rule dropped and what a threshold costs a language; the rows answer both without running the
pipeline again (``bloomline filters``). The row counts per (language, outcome, reason) equal the
ledger's; :func:`check_dropped` enforces it. Documented in ``data_prep/FORMAT.md``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from bloomline.io import publish, tmp_path
from data_prep.steps.filters import SCORES

DROPPED_DIR, SCORES_DIR = "dropped", "scores"

DROP_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("lang", pa.string()),
        ("stage", pa.string()),
        ("outcome", pa.string()),
        ("reason", pa.string()),
        ("score", pa.float64()),
        ("threshold", pa.float64()),
        ("duplicate_of", pa.string()),
        ("text", pa.string()),
    ]
)
SCORE_SCHEMA = pa.schema([("lang", pa.string()), ("reason", pa.string()), *((k, pa.float64()) for k in SCORES)])

ID_CHARS = 256
"""The longest id the drop log holds (``id``, ``duplicate_of``). An id is whatever a record's id
field holds: one of a megabyte made every later reader slow (the filter report's masking ran
for 14 minutes on it, issue 37), so a longer one is cut (:func:`capped_id`), keeping a hash of
the whole by which the record can still be found."""
_ID_HASH = 16  # hex digits of sha256: 64 bits, enough to tell the ids of one corpus apart


def capped_id(s: Optional[str]) -> Optional[str]:
    """``s`` when it has at most ``ID_CHARS`` characters; else its first characters, ``…`` and the
    first 16 hex digits of the sha256 of the whole ``s`` (UTF-8), ``ID_CHARS`` in all (so a capped
    id is left as it is)."""
    if s is None or len(s) <= ID_CHARS:
        return s
    digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:_ID_HASH]
    return f"{s[: ID_CHARS - _ID_HASH - 1]}…{digest}"


class DropLog:
    """Rows of dropped documents of one unit of work, in the order they were dropped."""

    def __init__(self, text_chars: int):
        self.text_chars = text_chars
        self.rows: list[dict[str, Any]] = []
        self._pos: list[int] = []  # each row's place in its chunk's input (add's ``pos``)

    def add(
        self,
        *,
        id: Optional[str],
        source: str,
        lang: str,
        stage: str,
        outcome: str,
        reason: str,
        score: Optional[float] = None,
        threshold: Optional[float] = None,
        duplicate_of: Optional[str] = None,
        text: Optional[str] = None,
        pos: int = 0,
    ) -> None:
        """One row; ``pos``, the document's position in its chunk (a record that could not be
        read: the position of the next document read), orders :meth:`in_input_order`."""
        self._pos.append(pos)
        self.rows.append(
            {
                "id": _utf8(id),
                "source": _utf8(source),
                "lang": lang,
                "stage": stage,
                "outcome": outcome,
                "reason": reason,
                "score": score,
                "threshold": threshold,
                "duplicate_of": duplicate_of,
                "text": _utf8(text[: self.text_chars]) if (text is not None and self.text_chars) else None,
            }
        )

    def in_input_order(self) -> list[dict[str, Any]]:
        """The rows in input order: the steps of a chunk run a batch of documents at a time
        (data_prep/steps/step.py BatchStep), so one step's drops of a batch are booked before the next
        step's of the same documents; a stable sort by position puts them back."""
        return [self.rows[i] for i in sorted(range(len(self.rows)), key=self._pos.__getitem__)]


def _utf8(s: Optional[str]) -> Optional[str]:
    """``s`` with lone surrogates (a record dropped as ``invalid_unicode`` has them) as U+FFFD."""
    return None if s is None else s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def write_rows(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write ``rows`` as one Parquet file, atomically; nothing when there are none. Ids
    (``id``, ``duplicate_of``) are capped (:func:`capped_id`)."""
    if not rows:
        return
    capped = [k for k in ("id", "duplicate_of") if k in schema.names]
    if capped:
        rows = [{**r, **{k: capped_id(r[k]) for k in capped}} for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    table = pa.Table.from_pylist(rows, schema=schema)
    # no statistics or page index that could vary: the same rows give the same bytes
    pq.write_table(table, tmp, compression="zstd", write_statistics=False)
    publish(tmp, path)


def dropped_path(out: Path, unit: str, cid: int) -> Path:
    return out / DROPPED_DIR / f"{unit}-c{cid:06d}.parquet"


def pack_dropped_path(out: Path, lang: str, k: int) -> Path:
    """What the pack pass dropped of one part: documents PII redaction or the tokenizer failed on."""
    return out / DROPPED_DIR / f"pack-{lang}-p{k:05d}.parquet"


def scores_path(out: Path, cid: int) -> Path:
    return out / SCORES_DIR / f"c{cid:06d}.parquet"


def drop_counts(
    folder: Path, lang: Optional[str] = None, reason: Optional[str] = None, batch_rows: int = 1 << 16
) -> Counter:
    """Rows of the drop log per (language, outcome, reason), optionally of one language or reason;
    three columns streamed a record batch at a time."""
    import pyarrow.compute as pc

    c: Counter = Counter()
    for f in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_rows, columns=["lang", "outcome", "reason"]):
            t = pa.Table.from_batches([b])
            if lang:
                t = t.filter(pc.equal(t["lang"], lang))
            if reason:
                t = t.filter(pc.equal(t["reason"], reason))
            for row in t.group_by(["lang", "outcome", "reason"]).aggregate([([], "count_all")]).to_pylist():
                c[(row["lang"], row["outcome"], row["reason"])] += row["count_all"]
    return c


def dropped_counts(out: Path) -> dict[str, dict[str, dict[str, int]]]:
    """Rows of ``DIR/dropped/`` per language, outcome and reason."""
    res: dict[str, dict[str, dict[str, int]]] = {}
    for (lang, outcome, reason), n in sorted(drop_counts(out / DROPPED_DIR).items()):
        res.setdefault(lang, {}).setdefault(outcome, {})[reason] = n
    return res


def check_dropped(out: Path, languages: dict[str, Any]) -> list[str]:
    """Where the drop log and the ledger (the manifest's ``languages``) disagree (empty: they agree)."""
    from data_prep.steps.document import OUTCOMES

    got, bad = dropped_counts(out), []
    for lang in sorted(set(got) | set(languages)):
        for outcome in OUTCOMES:
            want = {k: v for k, v in languages.get(lang, {}).get(outcome, {}).items() if v}
            have = got.get(lang, {}).get(outcome, {})
            if want != have:
                bad.append(f"{lang} {outcome}: the ledger has {want}, {out / DROPPED_DIR} has {have}")
    return bad
