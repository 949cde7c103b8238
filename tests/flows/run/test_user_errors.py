"""A user error's traceback is dropped from Prefect's run loggers, also once the record is masked
(masking keeps the exception's type only: bloomline/secrets.py mask_record)."""

import logging

from bloomline.errors import DataError
from bloomline.secrets import mask_record
from flows.run.user_errors import UserErrorTracebackFilter


def record_of(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except type(exc):
        import sys

        return logging.LogRecord("prefect.flow_runs", logging.ERROR, "", 0, "run failed", None, sys.exc_info())


def test_user_errors_lose_their_traceback_bugs_keep_it_masked_or_not():
    keep = UserErrorTracebackFilter().filter
    for masked in (False, True):
        user, bug = record_of(DataError("bad file")), record_of(KeyError("a bug"))
        if masked:
            mask_record(user), mask_record(bug)
            assert user.exc_info is None and "DataError: bad file" in user.exc_text
        assert not keep(user) and keep(bug)
