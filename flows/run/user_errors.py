"""User errors without Prefect's tracebacks.

Prefect's engine logs every failed task and flow run's exception with its traceback, once per
nesting level. For a BloomlineError (a bad config, corrupt data: something the user fixes) the
traceback says nothing the one-line message does not, and it pushes that message off the screen;
so those records are dropped, and the CLI prints the message (``error: ...``) itself. The failed
run's state message in the Prefect UI still carries the error. Other exceptions, bugs, keep
their traceback.
"""

from __future__ import annotations

import logging

from bloomline.errors import BloomlineError

ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class UserErrorTracebackFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # a masked record keeps its exception's type only (bloomline/secrets.py mask_record)
        kind = record.exc_info[0] if record.exc_info else getattr(record, "exc_type", None)
        return not (isinstance(kind, type) and issubclass(kind, BloomlineError)) and not says_disk_full(record)


def says_disk_full(record: logging.LogRecord) -> bool:
    """A record of a write that found no space (its exception, or the text a masked record or a
    Dask worker's "Compute Failed" keeps of it): the command ends with its own line about it
    (bloomline/disk.py), the same for every record Prefect and Dask log of that one failure."""
    from bloomline.disk import FULL_WORDS, full_disk

    if record.exc_info and record.exc_info[1] is not None and full_disk(record.exc_info[1]):
        return True
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
        return False
    text += record.exc_text or ""
    return any(words in text for words in FULL_WORDS)


class DiskFullFilter(logging.Filter):
    """For a Dask worker's loggers: its report of a task that found no space."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not says_disk_full(record)


def install() -> None:
    """Add the filter to Prefect's run loggers (idempotent)."""
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserErrorTracebackFilter) for f in logger.filters):
            logger.addFilter(UserErrorTracebackFilter())
