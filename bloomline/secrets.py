"""Masking secrets before anything is written where people read: logs, artifacts, and the copies
of recipes kept in run folders.

What counts as a secret: the password of a URL (``scheme://user:PASSWORD@host``, up to the last
``@`` of the URL: a password may hold ``@`` and ``/``), secret-looking query parameters
(``?token=…``, ``&sig=…``, ``client_secret``, ``access_key``, ``apikey``, AWS ``X-Amz-Signature`` /
``X-Amz-Credential``, Google ``X-Goog-Signature``), an ``Authorization`` header's value and a
``Bearer`` token, the value of a ``password=`` / ``passwd=`` / ``secret=`` / ``token=`` pair and
of a JSON member whose key is secret-named, and the value of any mapping key or
environment variable whose name says it holds one (TOKEN, SECRET, PASSWORD, PASSPHRASE,
PRIVATE_KEY, API_KEY, ACCESS_KEY, CREDENTIAL, AUTH, ``*_PASS``, ``*_PWD``). Masked values read
``***``. The programs themselves get the real values (configs, environments; the ranks on this
node a private copy of the recipe, flows/stages/train_job.py ``ranks_recipe``); what is shown or stored
is masked: every log record of the processes bloomline starts, of any logger, with its traceback
(the flows install the masking when imported, Dask workers by a callback), every line a child
process writes to a log file (:func:`copy_masked`), every Prefect artifact, flow-run parameter
(flows/run/params.py) and failed state's message (:func:`masks_exceptions`), every recipe copy kept
in a run folder. Secrets seen in a config are remembered (:func:`remember`) and masked in any
form after. Every search is linear in the text's length: masking runs on whatever a file holds.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import IO, Any, Callable, Iterator, Mapping

from bloomline.errors import BloomlineError
from bloomline.terminal import printable

MASK = "***"
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|PRIVATE_?KEY|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH|_PASS\Z|_PWD\Z",
    re.IGNORECASE,
)
"""A name (mapping key, environment variable) whose value is a secret. ``*_PASS`` and ``*_PWD``
only as a suffix after ``_``: ``PWD`` itself is the working directory."""
# A URL's credentials, ``scheme://user:PASSWORD@host``, found by :func:`_url_password_spans` in
# one pass from each ``://`` that ends a scheme (a scheme character before it, however the scheme
# starts: a log line may glue it to the word before), the user after it, and the password, which
# may hold ``@`` and ``/`` (written unencoded), to the last ``@`` before the end of the URL. One
# backtracking pattern took time quadratic in a run of scheme characters (40k characters of
# ``a.a.a…``: 6.8 s, issue 37).
_SCHEME_CHAR = re.compile(r"[a-z0-9+.-]", re.IGNORECASE)
_URL_USER = re.compile(r"[^:/@\s]*:")
_URL_TOKEN = re.compile(r"[^:/@\s\"'<>`]{16,512}@")
"""A user part with no password that is a token (GitHub's ``https://ghp_…@github.com``, Hugging
Face's ``hf_…``): 16 characters or more, where user names are short."""
_URL_END = re.compile(r"[\s\"'<>`]")
"""Where a URL ends, for the password's search: whitespace, or a quote or bracket around it."""
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?=[a-z0-9_.-]{1,64}=)(?:[a-z0-9_.-]{0,40}(?:token|secret|passw(?:or)?d|signature|credential)|"
    r"(?:[a-z0-9_.-]{0,40}[_.-])?(?:api_?key|access_?key|key|sig))=)(?P<value>[^&\s\"']+)",
    re.IGNORECASE,
)
"""A secret query parameter: ``token``, ``access_token``, ``client_secret``, ``password``, AWS's
``X-Amz-Signature`` / ``X-Amz-Credential`` / ``X-Amz-Security-Token``, Google's
``X-Goog-Signature`` / ``X-Goog-Credential``, ``key``, ``apikey``, ``api_key``, ``access_key``,
``sig`` (a name of at most 40 characters before the word; each try bounded, and one that no
``=`` follows soon fails at once: ``&a&a…`` took 0.3 s a megabyte)."""
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?"
    r"(?:(?:bearer|basic|digest|token|negotiate|aws4-hmac-sha256)[ \t]{1,8})?)(?P<value>[^\s\"'][^\r\n\"']*)",
    re.IGNORECASE,
)
"""An HTTP ``Authorization`` (or ``Proxy-Authorization``) header: its whole value after the scheme
word, to the end of the line (AWS's signs a list of fields)."""
_BEARER = re.compile(r"(?P<head>\bbearer[ \t]{1,8})(?P<value>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
"""A bearer token on its own (``Bearer eyJ…``), as a client library quotes it."""
_PAIR = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z0-9_.-]{1,64})(?P<eq>[ \t]{0,8}=[ \t]{0,8}[\"']?)(?P<value>[^\s\"'&,;]+)"
)
_PAIR_NAME = re.compile(
    r"(?:passw(?:or)?d|passphrase|secret|token|signature|api_?key|access_?key|private_?key|credentials?|_pwd)\Z",
    re.IGNORECASE,
)
"""A ``name=value`` pair whose name ends in a secret's word (``password=``, ``passwd=``,
``secret=``, ``token=``, ``aws_secret_access_key =``): its value. Only as the name's end, so
``tokens=128`` is left as it is."""
_JSON_PAIR = re.compile(r'"(?P<name>[^"\\\n]{1,64})"(?P<sep>[ \t]{0,8}:[ \t]{0,8})"(?P<value>(?:[^"\\\n]|\\.)*)"')
"""A JSON string member, ``"aws_secret_access_key": "…"``: masked when its key is secret-named
(:data:`SECRET_NAME`, as :func:`mask_tree` masks a tree's)."""


def _mask_pairs(text: str) -> str:
    text = _AUTH_HEADER.sub(lambda m: m["head"] + MASK, text)
    text = _BEARER.sub(lambda m: m["head"] + MASK, text)
    text = _PAIR.sub(lambda m: m["name"] + m["eq"] + MASK if _PAIR_NAME.search(m["name"]) else m[0], text)
    return _JSON_PAIR.sub(
        lambda m: f'"{m["name"]}"{m["sep"]}"{MASK}"' if SECRET_NAME.search(m["name"]) and m["value"] else m[0], text
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


def _url_password_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each URL password of ``text``, in order: from the end of a head
    ``scheme://user:`` to the last ``@`` before the URL ends (``_URL_END``). Linear: the text is
    read forwards once, each URL's end and last ``@`` searched once; a ``://`` inside a password
    found, or after a URL's last ``@``, begins no other."""
    sep = text.find("://")
    while sep >= 0:
        head = bool(sep) and _SCHEME_CHAR.match(text, sep - 1) is not None
        user = _URL_USER.match(text, sep + 3) if head else None
        if user is None:
            token = _URL_TOKEN.match(text, sep + 3) if head else None
            if token is not None:  # https://TOKEN@host: a token as the whole user part
                yield sep + 3, token.end() - 1
            sep = text.find("://", sep + 3)
            continue
        start = user.end()
        stop = _URL_END.search(text, start)
        end = stop.start() if stop else len(text)
        last_at = text.rfind("@", start, end)
        if last_at > start:  # a password of one character or more
            yield start, last_at
            sep = text.find("://", last_at)
        else:  # no "@" after this head in its URL: none after a later head in it either
            sep = text.find("://", end)


def _url_passwords(text: str) -> list[str]:
    return [text[a:b] for a, b in _url_password_spans(text)]


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
        return set(_url_passwords(obj)) | {m["value"] for m in _QUERY_SECRET.finditer(obj)}
    return set()


def remember(obj: Any) -> None:
    """Mask the secrets of ``obj`` (:func:`secret_parts`) in everything this process masks from now on."""
    _REMEMBERED.update(v for v in secret_parts(obj) if len(v) >= _MIN_SECRET_LEN)


def mask_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with URL passwords, secret query parameters and secret environment values masked."""
    if not text:
        return text
    parts, last = [], 0
    for start, end in _url_password_spans(text):
        parts += (text[last:start], MASK)
        last = end
    if parts:
        text = "".join(parts) + text[last:]
    text = _QUERY_SECRET.sub(lambda m: m["head"] + MASK, text)
    text = _mask_pairs(text)
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


def mask_exception(exc: BaseException) -> BaseException:
    """``exc`` with its message masked, for what records it: Prefect keeps a failed flow or task
    run's state message, ``"{type}: {exc}"``, in its database. Masked in place where ``str(exc)``
    is made of its string arguments (most exceptions, BloomlineError's included) or, for an
    OSError, of its message and file names, so the same exception goes on and handlers that
    catch it by type still do; else (an exception that formats other fields of its own) a
    RuntimeError of the masked message, the original as its context."""
    text = str(exc)
    if mask_text(text) == text:
        return exc
    exc.args = tuple(mask_text(a) if isinstance(a, str) else a for a in exc.args)
    if isinstance(exc, OSError):
        for name in ("strerror", "filename", "filename2"):
            if isinstance(getattr(exc, name), str):
                setattr(exc, name, mask_text(getattr(exc, name)))
    if isinstance(exc, BloomlineError) and hasattr(exc, "message") and isinstance(exc.message, str):
        exc.message = mask_text(exc.message)  # ConfigError's own field
    if mask_text(str(exc)) == str(exc):
        return exc
    replaced = RuntimeError(f"{type(exc).__name__}: {mask_text(str(exc))}")
    replaced.__context__ = exc
    return replaced


def masks_exceptions(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, whose exceptions leave it masked (:func:`mask_exception`): for the functions Prefect
    runs as flows and tasks, whose failed states it records."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            masked = mask_exception(e)
            if masked is e:
                raise
            raise masked from None

    run.masks_exceptions = True  # type: ignore[attr-defined]
    return run


def copy_masked(src: IO[bytes], dst: IO[bytes]) -> None:
    """Copy a child process's output, line by line as it comes, into ``dst`` with secrets masked
    (a thread's target; ends at the child's end of output)."""
    for line in iter(src.readline, b""):
        dst.write(mask_text(line.decode("utf-8", "replace")).encode("utf-8"))
        dst.flush()


def mask_record(record: logging.LogRecord) -> None:
    """Mask a log record in place: its message (arguments merged in), its traceback and its stack;
    their control characters escaped too (bloomline/terminal.py ``printable``: records reach a
    terminal, and a message may quote a file).

    The traceback is formatted here and kept masked as ``exc_text`` (what ``logging.Formatter``
    prints), and ``exc_info`` cleared: a handler that formats the exception itself (Prefect's
    ``JsonFormatter``, rich's tracebacks) would show it unmasked. The exception's type stays, as
    ``exc_type``, for filters that decide by it (flows/run/user_errors.py)."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is the logger's problem, not ours
        message = None
    if message is not None:
        masked = printable(mask_text(message))
        if masked != message:
            record.msg, record.args = masked, None
    if record.exc_info and record.exc_info[0] is not None:
        if not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        record.exc_type = record.exc_info[0]
        record.exc_info = None
    if record.exc_text:
        record.exc_text = printable(mask_text(record.exc_text))
    if record.stack_info:
        record.stack_info = printable(mask_text(record.stack_info))


_FORMATTER = logging.Formatter()


class MaskingFilter(logging.Filter):
    """Masks each record (:func:`mask_record`) before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        mask_record(record)
        return True


def _masking_factory(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        mask_record(record)
        return record

    make.bloomline_masking = True  # type: ignore[attr-defined]
    return make


def install_log_masking(
    names: tuple[str, ...] = ("prefect", "prefect.flow_runs", "prefect.task_runs", "distributed"),
) -> None:
    """Mask every log record of this process (idempotent): each is masked as it is made (the
    record factory), whatever its logger. A logger's filters see only the records logged on that
    logger itself, not its children's (``distributed.worker``, ``distributed.nanny``, …), which is
    how Dask's escaped; the filter stays on ``names`` for records made elsewhere and handed to
    them (``logging.makeLogRecord``)."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "bloomline_masking", False):
        logging.setLogRecordFactory(_masking_factory(factory))
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, MaskingFilter) for f in logger.filters):
            logger.addFilter(MaskingFilter())
