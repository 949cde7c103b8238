"""One evaluation task's entry, as recipes write it: the evaluation's ``tasks`` (eval/tasks/) and
the data recipe's ``decontaminate.tasks`` (data_prep/steps/decontaminate.py) take the same entries, so
the training data is cleaned against exactly the items its dashboard reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from bloomline.config import Location, check
from bloomline.errors import DataError


@dataclass
class TaskSpec:
    """One evaluation task of ``tasks`` (eval/tasks/: what each needs and reports)."""

    name: str = "continuation"
    """The task's name in eval/tasks/'s registry (``continuation``, ``xstorycloze``, ...)."""
    data: Optional[Location] = None
    """Its data folder, ``DATA/<lang>.jsonl`` per language, for tasks that read items from files."""
    langs: Optional[list[str]] = None
    """Only these languages (bloomline codes); None: every language the task can run."""
    limit: Optional[int] = None
    """At most this many items per language (the first ones, the same every round); None: the task's own default."""

    def validate(self) -> None:
        check(bool(self.name), "name", "must name a task")
        check(self.limit is None or self.limit >= 1, "limit", "must be >= 1")


def folder_digest(folder: str | Path) -> dict[str, str]:
    """sha256 of every task file of ``folder`` (file name → hash): what a reuse key or a manifest
    records of a task's items, so that edited items are never mistaken for the same ones."""
    from bloomline.io import sha256_file

    return {p.name: sha256_file(p) for p in sorted(Path(folder).glob("*.jsonl"))}


def task_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a task file ``DATA/<lang>.jsonl``, blank lines skipped; a
    DataError naming ``path:line`` for a line that is not a JSON object (or the file for bytes
    that are not UTF-8). The one reader of task files: evaluation and decontamination."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{path}:{no}: not a JSON record ({str(e).splitlines()[0][:80]})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{no}: a record must be a JSON object, not {type(rec).__name__}")
        yield no, rec
