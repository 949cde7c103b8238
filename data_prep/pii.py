"""PII redaction: emails, IP addresses and phone numbers → placeholder tokens.

The placeholders are added to the SentencePiece vocabulary as user-defined symbols, so each is
one token and the model learns "an email was here" rather than fragments of one.

Patterns are deliberately conservative (a false positive corrupts text, in code especially):

* email — RFC 5322's common subset: ``local@domain.tld`` with a 2+ letter TLD.
* ip_address — dotted IPv4 with each octet 0-255, not inside a longer dotted number (version
  strings like ``1.2.3.4.5``), and full or ``::``-compressed IPv6 with at least two groups
  and a ``::`` or eight groups (so ``12:30`` times and ``a::b`` C++ scopes are not caught:
  each group must be hexadecimal and the address must have 3+ colons).
* phone — an international ``+`` prefix with 8-15 digits, or a national number with at
  least 9 digits written in groups separated by spaces, dots or dashes, optionally with an
  area code in parentheses. Plain digit runs (ids, years, numeric literals) are left alone.
"""

from __future__ import annotations

import re

from data_prep.config import PIIConfig
from data_prep.document import Document, Ledger
from data_prep.step import PipelineStep

PLACEHOLDERS = {"email": "<EMAIL>", "ip_address": "<IP_ADDRESS>", "phone": "<PHONE>"}

_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}(?![\w-])")

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d]|\.\d)"
_H = r"[0-9A-Fa-f]{1,4}"
_IPV6 = (
    rf"(?<![\w:])(?:(?:{_H}:){{7}}{_H}"  # full form
    rf"|(?:{_H}:){{1,6}}:(?:{_H}:){{0,5}}{_H}"  # compressed with groups on both sides
    rf"|(?:{_H}:){{2,7}}:"  # trailing ::
    rf"|::(?:{_H}:){{1,6}}{_H})(?![\w:])"  # leading ::
)
# The IP and phone patterns start with a lookahead for the characters a match can start with: sre
# then skips to those characters instead of trying the lookbehind at every position (3× faster,
# the same matches).
_IP = re.compile(rf"(?=[\d:A-Fa-f])(?:{_IPV4}|{_IPV6})")
# With fewer than two colons no IPv6 branch can match (each needs "::" or 7 colons), and the
# search needs only the IPv4 branch, which starts at a digit: most text, scanned 3× faster.
_IP4 = re.compile(rf"(?=\d){_IPV4}")

_PHONE = re.compile(
    r"(?=[+(\d])(?<![\w+])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"  # +CC ...
    r"|\(\d{2,4}\)[ .-]?\d{3,4}[ .-]\d{3,4}"  # (area) xxx-xxxx
    r"|\d{2,4}[ .-]\d{3,4}[ .-]\d{3,4}(?:[ .-]\d{2,4})?"  # xxx-xxx-xxxx
    r")(?![\w])"
)


# Every IPv4 address and every phone number redacted holds a run of 7+ characters of digits,
# spaces, dots, dashes and parentheses that starts with a digit ("1.2.3.4"; a phone's 8+ digits
# after its "+" or "("). Most documents have none (95% of ../shared/corpus's): for them that one
# search (~110 MB/s) replaces the two patterns' (~40 MB/s each), with the same result. The
# placeholders put in by an earlier pattern hold no digit, so they cannot make such a run.
_NUMBER_RUN = re.compile(r"\d[\d .()-]{6}")


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


def _ipv6_ok(m: re.Match) -> bool:
    s = m.group(0)
    return s.count(":") >= 3 or "." in s


def redact(
    text: str, kinds: list[str] | tuple[str, ...] = ("email", "ip_address", "phone")
) -> tuple[str, dict[str, int]]:
    """Return (redacted text, {kind: count})."""
    counts: dict[str, int] = {}
    if "email" in kinds and "@" in text:
        text, n = _EMAIL.subn(PLACEHOLDERS["email"], text)
        counts["email"] = n
    numbers = _NUMBER_RUN.search(text) is not None
    ipv6 = text.count(":") >= 2  # each IPv6 form has "::" or seven colons
    if "ip_address" in kinds and (numbers or ipv6):
        n = 0

        def ip_sub(m: re.Match) -> str:
            nonlocal n
            if ":" in m.group(0) and not _ipv6_ok(m):
                return m.group(0)
            n += 1
            return PLACEHOLDERS["ip_address"]

        text = (_IP if ipv6 else _IP4).sub(ip_sub, text)
        counts["ip_address"] = n
    if "phone" in kinds and numbers:
        n = 0

        def phone_sub(m: re.Match) -> str:
            nonlocal n
            s = m.group(0)
            d = _digits(s)
            if (s.startswith("+") and 8 <= d <= 15) or (not s.startswith("+") and 9 <= d <= 15):
                n += 1
                return PLACEHOLDERS["phone"]
            return s

        text = _PHONE.sub(phone_sub, text)
        counts["phone"] = n
    return text, {k: v for k, v in counts.items() if v}


class PIIRedactor(PipelineStep):
    """The redaction as a pipeline step (the pack stage's first): each document's PII replaced by
    placeholders, the counts booked per language in the ledger (``pii``) and in the step's stats;
    a document redaction fails on is booked as ``pii.<exception>`` (data_prep/step.py)."""

    name = "pii"

    def __init__(self, cfg: PIIConfig, ledger: Ledger, strict: bool = False):
        super().__init__(ledger, strict)
        self.kinds = tuple(cfg.kinds)
        self.counts: dict[str, int] = {}

    def process(self, doc: Document) -> Document:
        doc.text, counts = redact(doc.text, self.kinds)
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
            self.stats[kind] += n
            self.ledger.pii(doc.lang, kind, n)
        return doc
