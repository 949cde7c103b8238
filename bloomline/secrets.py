"""Masking secrets before anything is written where people read: logs, artifacts, and the copies
of recipes kept in run folders.

What counts as a secret: the password of a URL (``scheme://user:PASSWORD@host``), secret-looking
query parameters (``?token=…``, ``&sig=…``, AWS ``X-Amz-Signature`` / ``X-Amz-Credential``), and
the value of any mapping key or environment variable whose name says it holds one (TOKEN,
SECRET, PASSWORD, API_KEY, ACCESS_KEY, CREDENTIAL, AUTH). Masked values read ``***``. The
programs themselves get the real values (configs, environments; the ranks on this node a private
copy of the recipe, flows/train_job.py ``ranks_recipe``); what is shown or stored is masked: every log
record of the processes bloomline starts (the flows install the filter when imported, Dask
workers by a callback), every line a child process writes to a log file (:func:`copy_masked`),
every Prefect artifact and flow-run parameter (flows/params.py), every recipe copy kept in a run
folder. Secrets seen in a config are remembered (:func:`remember`) and masked in any form after.
"""

from __future__ import annotations

import logging
import os
import re
from typing import IO, Any, Mapping

MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@/\s]+)(?=@)", re.IGNORECASE)
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?:[a-z_]*token|key|api_key|sig|signature|password|secret|x-amz-signature|x-amz-credential|"
    r"x-amz-security-token)=)(?P<value>[^&\s\"']+)",
    re.IGNORECASE,
)
# Values of secret-named environment variables seen at import and at each mask_text call, so a
# token that reached a message verbatim (an echoed command line) is masked too.
_MIN_SECRET_LEN = 6  # shorter values ("1", "true") would mask ordinary words


_REMEMBERED: set[str] = set()
"""Secret values this process has seen in configs (:func:`remember`): masked wherever they appear
later, in whatever form (an exception quoting a URL's password without its scheme)."""


def _env_secrets(env: Mapping[str, str]) -> list[str]:
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(found | _REMEMBERED, key=len, reverse=True)


def secret_parts(obj: Any) -> set[str]:
    """The secrets in a JSON-like tree: values under secret-named keys, URL passwords, secret
    query parameters."""
    if isinstance(obj, dict):
        return set().union(
            *(
                [
                    {v}
                    if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and v
                    else secret_parts(v)
                    for k, v in obj.items()
                ]
                or [set()]
            )
        )
    if isinstance(obj, list):
        return set().union(*([secret_parts(v) for v in obj] or [set()]))
    if isinstance(obj, str):
        return {m["pw"] for m in _URL_PASSWORD.finditer(obj)} | {m["value"] for m in _QUERY_SECRET.finditer(obj)}
    return set()


def remember(obj: Any) -> None:
    """Mask the secrets of ``obj`` (:func:`secret_parts`) in everything this process masks from now on."""
    _REMEMBERED.update(v for v in secret_parts(obj) if len(v) >= _MIN_SECRET_LEN)


def mask_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with URL passwords, secret query parameters and secret environment values masked."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    text = _QUERY_SECRET.sub(lambda m: m["head"] + MASK, text)
    for value in _env_secrets(os.environ if env is None else env):
        text = text.replace(value, MASK)
    return text


def mask_tree(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """A copy of a JSON-like tree with every string masked, and the value under a secret-named key replaced."""
    if isinstance(obj, dict):
        return {
            k: (
                MASK if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and v else mask_tree(v, env)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [mask_tree(v, env) for v in obj]
    if isinstance(obj, str):
        return mask_text(obj, env)
    return obj


def copy_masked(src: IO[bytes], dst: IO[bytes]) -> None:
    """Copy a child process's output, line by line as it comes, into ``dst`` with secrets masked
    (a thread's target; ends at the child's end of output)."""
    for line in iter(src.readline, b""):
        dst.write(mask_text(line.decode("utf-8", "replace")).encode("utf-8"))
        dst.flush()


class MaskingFilter(logging.Filter):
    """Masks each record's message (its arguments merged in) before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logger's problem, not ours
            return True
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def install_log_masking(
    names: tuple[str, ...] = ("prefect", "prefect.flow_runs", "prefect.task_runs", "distributed"),
) -> None:
    """Add the masking filter to these loggers (idempotent). Filters run only for records logged
    on the logger itself, so each run logger is named."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, MaskingFilter) for f in logger.filters):
            logger.addFilter(MaskingFilter())
