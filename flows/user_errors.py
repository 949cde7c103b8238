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
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, BloomlineError)


def install() -> None:
    """Add the filter to Prefect's run loggers (idempotent)."""
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserErrorTracebackFilter) for f in logger.filters):
            logger.addFilter(UserErrorTracebackFilter())
