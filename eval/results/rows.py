"""The rows of contract 3 (eval/RESULTS.md) as the code handles them: a long row's and the
validation task's wide row's shapes, which rows are one language's, and the conversions between
the long form the results files hold and the wide form (version 1's, eval.results.metrics.metric_rows').
eval/results/table.py reads and writes the files; this module only shapes rows."""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, TypedDict, TypeVar

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)

Scope = Literal["language", "group", "overall"]
"""A row's ``scope``: one language, or an aggregate of a group of them or of all."""


class Identity(TypedDict):
    """What names a result apart from its task and metric: the columns a long and a wide row share."""

    run: str
    step: int
    checkpoint: str
    scope: Scope
    lang: str
    family: str
    weighting: str
    tokens_seen: Optional[int]
    epochs_seen: Optional[float]
    precision: str
    layout: str
    eval_layout: str
    data_manifest_sha256: str
    evaluated_at: Any


class ResultRow(Identity):
    """One row of a results file (version 4; the columns of eval/results/table.py ``SCHEMA``, in
    the file's own order there, eval/RESULTS.md): its identity, and one metric of one task."""

    task: str
    metric: str
    value: Optional[float]
    stderr: Optional[float]
    n: Optional[int]
    note: Optional[str]


class ValidationRow(Identity):
    """One row of :func:`validation_rows`: the validation task's metrics of one (step, scope,
    lang, weighting), in wide form (the dashboard, the regressions and the online mixture read these)."""

    loss: float
    ppl: float
    bpb: float
    tokens: int
    bytes: int
    docs: int


IDENTITY = tuple(Identity.__annotations__)
"""The identity's columns, in order."""

Row = TypeVar("Row", ResultRow, ValidationRow, dict)


def is_language(row: ResultRow | ValidationRow | dict[str, Any]) -> bool:
    """Whether a row is one language's, not an aggregate's."""
    return row["scope"] == "language"


def of_languages(rows: Iterable[Row]) -> list[Row]:
    """The rows of single languages (scope ``language``), not the aggregates."""
    return [r for r in rows if is_language(r)]


VALIDATION = "validation"
"""The task every evaluation runs: loss, ppl and bits per byte on the data's validation split."""
VALIDATION_METRICS = ("loss", "ppl", "bpb", "tokens", "bytes", "docs")


def long_rows(wide: list[dict[str, Any]], task: str = VALIDATION) -> list[ResultRow]:
    """Wide rows (one per language or aggregate, a column per metric: version 1's, and
    eval.results.metrics.metric_rows') as version 2's long rows of ``task``; ``n`` is the predicted tokens."""
    out = []
    for r in wide:
        base = {k: r.get(k) for k in IDENTITY}
        for m in VALIDATION_METRICS:
            if m in r:
                out.append(
                    {
                        **base,
                        "task": task,
                        "metric": m,
                        "value": None if r[m] is None else float(r[m]),
                        "stderr": None,
                        "n": r.get("tokens"),
                        "note": None,
                    }
                )
    return out


def validation_rows(table: pa.Table) -> list[ValidationRow]:
    """The validation task's rows of a results table, one per (step, scope, lang, weighting) with
    its metrics as keys (``loss``, ``ppl``, ``bpb``, ``tokens``, ``bytes``, ``docs``) beside
    ``step``, ``scope``, ``lang``, ``family``, ``weighting``, ``tokens_seen``: the view the
    dashboard, the regressions, the mixture's feedback and its reference curve read."""
    out: dict[tuple, Any] = {}
    for r in table.filter(pa.compute.equal(table["task"], VALIDATION)).to_pylist():
        key = (r["step"], r["scope"], r["lang"], r["weighting"])
        row = out.setdefault(key, {k: r[k] for k in IDENTITY})
        v = r["value"]
        row[r["metric"]] = int(v) if r["metric"] in ("tokens", "bytes", "docs") and v is not None else v
    return list(out.values())
