"""Masking secrets before anything is written where people read: logs, artifacts, and the copies
of recipes kept in run folders.

What counts as a secret: the password of a URL (``scheme://user:PASSWORD@host``), secret-looking
query parameters (``?token=…``, ``&sig=…``, AWS ``X-Amz-Signature`` / ``X-Amz-Credential``), and
the value of any mapping key or environment variable whose name says it holds one (TOKEN,
SECRET, PASSWORD, API_KEY, ACCESS_KEY, CREDENTIAL, AUTH). Masked values read ``***``. The
programs themselves still get the real values; only what is shown or stored is masked.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Mapping

MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@/\s]+)(?=@)", re.IGNORECASE)
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?:[a-z_]*token|key|api_key|sig|signature|password|secret|x-amz-signature|x-amz-credential|"
    r"x-amz-security-token)=)(?P<value>[^&\s\"']+)", re.IGNORECASE)
# Values of secret-named environment variables seen at import and at each mask_text call, so a
# token that reached a message verbatim (an echoed command line) is masked too.
_MIN_SECRET_LEN = 6  # shorter values ("1", "true") would mask ordinary words


def _env_secrets(env: Mapping[str, str]) -> list[str]:
    return sorted({v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)


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
        return {k: (MASK if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and v
                    else mask_tree(v, env)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_tree(v, env) for v in obj]
    if isinstance(obj, str):
        return mask_text(obj, env)
    return obj


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


def install_log_masking(names: tuple[str, ...] = ("prefect", "prefect.flow_runs", "prefect.task_runs", "distributed")) -> None:
    """Add the masking filter to these loggers (idempotent). Filters run only for records logged
    on the logger itself, so each run logger is named."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, MaskingFilter) for f in logger.filters):
            logger.addFilter(MaskingFilter())
