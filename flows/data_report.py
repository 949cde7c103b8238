"""The filter report of a prepared data folder (``bloomline filters``, and the ``filter-report``
Prefect artifact at the end of ``prepare``): data_prep/filter_report.py over ``DIR/dropped/`` and
``DIR/scores/``, after checking the drop log against the manifest's ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from bloomline import languages
from bloomline.config import from_dict
from bloomline.errors import DataError
from data_prep.config import FilterConfig
from data_prep.droplog import check_dropped
from data_prep.shards import load_manifest


def filter_report(data: str | Path, lang: Optional[str] = None, reason: Optional[str] = None, examples: int = 3,
                  sets: Sequence[str] = ()) -> str:
    """The Markdown report; refuses data without a drop log or whose drop log disagrees with its ledger."""
    from data_prep.filter_report import render

    data = Path(data)
    m = load_manifest(data)
    if "dropped" not in m:
        raise DataError(f"{data} was prepared before bloomline kept a drop log: prepare it again for a filter report")
    bad = check_dropped(data, m["languages"])
    if bad:
        raise DataError(f"{data}: the drop log does not match the manifest's ledger ({bad[0]}"
                        + (f", and {len(bad) - 1} more" if len(bad) > 1 else "") + ")")
    code = None
    if lang:
        code = languages.resolve(lang)
        if code is None:
            raise DataError(f"--lang {lang}: not one of BLOOM's languages")
    if examples < 0:
        raise DataError("--examples must be >= 0")
    cfg = from_dict(FilterConfig, m["config"]["filters"])
    return render(data, cfg, code, reason, examples, list(sets))
