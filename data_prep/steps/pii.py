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

import heapq
import re
from typing import Callable, Iterable, Iterator

from data_prep.config import PIIConfig
from data_prep.steps.document import Document, Ledger
from data_prep.steps.step import PipelineStep

PLACEHOLDERS = {"email": "<EMAIL>", "ip_address": "<IP_ADDRESS>", "phone": "<PHONE>"}

_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}(?![\w-])")
_DOMAIN_RUN = re.compile(r"[A-Za-z0-9.-]*")


def _sub_emails(text: str) -> tuple[str, int]:
    """``_EMAIL.subn(placeholder, text)``, searched only around each "@". An address holds one
    "@", at most 64 characters after its start, and its domain lies in the run of domain
    characters after it: so each "@" needs one search of that window (the lookarounds see the
    characters around it). Most of the text is never scanned; the sub scanned all of it, trying
    the lookbehind at every character (the pattern has no literal prefix)."""
    out, last, n = [], 0, 0
    at = text.find("@")
    while at != -1:
        end = _DOMAIN_RUN.match(text, at + 1).end()
        m = _EMAIL.search(text, max(last, at - 64), end + 1)
        if m:  # it holds this "@": an earlier one in the window had no address (or was taken)
            out += (text[last : m.start()], PLACEHOLDERS["email"])
            last, n = m.end(), n + 1
        at = text.find("@", end)
    if not n:
        return text, 0
    out.append(text[last:])
    return "".join(out), n


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
# Without "::" and with fewer than seven colons no IPv6 branch can match, and the search needs
# only the IPv4 branch, which starts at a digit: most text, scanned 3× faster.
_IP4 = re.compile(rf"(?=\d){_IPV4}")

_PHONE = re.compile(
    r"(?=[+(\d])(?<![\w+])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"  # +CC ...
    r"|\(\d{2,4}\)[ .-]?\d{3,4}[ .-]\d{3,4}"  # (area) xxx-xxxx
    r"|\d{2,4}[ .-]\d{3,4}[ .-]\d{3,4}(?:[ .-]\d{2,4})?"  # xxx-xxx-xxxx
    r")(?![\w])"
)


# The IP and phone patterns are searched only inside runs of the characters their matches are made
# of, around a seed that every match holds: each run with the text's characters on either side
# visible to the lookarounds (``finditer(text, pos, endpos)``: a lookbehind sees before ``pos``).
# That finds what a search of the whole text finds, since no match crosses a character outside
# its run's class; most text is never scanned. The placeholders hold none of the classes'
# characters, so they end a run as any letter does.
#
# Number runs: an IPv4 address or a phone number is digits, spaces, dots, dashes, parentheses and
# "+", and its first digit has 6+ more of those after it ("1.2.3.4"; a phone's 8+ digits). Most
# documents have no such run (95% of ../shared/corpus's): for them one search (~110 MB/s)
# replaces the two patterns' (~40 MB/s each).
_NUMBER_RUN = re.compile(r"\d[\d .()+-]{6,}")
_NUMBER_CHARS = frozenset("0123456789 .()+-")
# Address runs, where an IPv6 form can occur ("::" or seven colons in the text; C++'s "std::"
# puts one in most of its files): hex digits, colons and dots, around two colons with at most four
# hex digits between them (every IPv6 form has "::" or ":H:"), or an IPv4 address's digit with 6+
# digits and dots after it. Two seeds, as each alone starts with what sre can skip to quickly.
_IP_SEEDS = (re.compile(r":[0-9A-Fa-f]{0,4}:"), re.compile(r"\d[\d.]{6}"))
_IP_CHARS = frozenset("0123456789ABCDEFabcdef:.")


def _runs(seeds: Iterable[re.Pattern], chars: frozenset[str], text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each maximal run of ``chars`` that holds a match of a seed, in order.

    The seeds' matches are merged as they come (each ``finditer`` yields in order), not collected:
    a run can hold a match every other character (1 MiB of ``:`` is 512Ki matches, 60 MiB as a
    sorted list), and only the runs are kept."""
    end, n = 0, len(text)
    for start, stop in heapq.merge(*((m.span() for m in seed.finditer(text)) for seed in seeds)):
        if start < end:  # in the run before
            continue
        end = stop
        while start > 0 and text[start - 1] in chars:
            start -= 1
        while end < n and text[end] in chars:
            end += 1
        yield start, end


def _sub_in_runs(
    pattern: re.Pattern, repl: Callable[[re.Match], str], text: str, runs: Iterable[tuple[int, int]]
) -> str:
    """``pattern.sub(repl, text)`` for a pattern whose every match lies inside one of ``runs``."""
    out, last = [], 0
    for start, end in runs:
        for m in pattern.finditer(text, start, end + 1):  # + 1: the lookahead sees past the run
            out += (text[last : m.start()], repl(m))
            last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


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
        text, counts["email"] = _sub_emails(text)
    numbers = _NUMBER_RUN.search(text) is not None
    ipv6 = "::" in text or text.count(":") >= 7  # each IPv6 form has "::" or seven colons
    if "ip_address" in kinds and (numbers or ipv6):
        n = 0

        def ip_sub(m: re.Match) -> str:
            nonlocal n
            if ":" in m.group(0) and not _ipv6_ok(m):
                return m.group(0)
            n += 1
            return PLACEHOLDERS["ip_address"]

        if ipv6:
            text = _sub_in_runs(_IP, ip_sub, text, _runs(_IP_SEEDS, _IP_CHARS, text))
        else:
            text = _sub_in_runs(_IP4, ip_sub, text, _runs((_NUMBER_RUN,), _NUMBER_CHARS, text))
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

        text = _sub_in_runs(_PHONE, phone_sub, text, _runs((_NUMBER_RUN,), _NUMBER_CHARS, text))
        counts["phone"] = n
    return text, {k: v for k, v in counts.items() if v}


class PIIRedactor(PipelineStep):
    """The redaction as a pipeline step (the pack pass's first): each document's PII replaced by
    placeholders, the counts booked per language in the ledger (``pii``) and in the step's stats;
    a document redaction fails on is booked as ``pii.<exception>`` (data_prep/steps/step.py)."""

    name = "pii"

    def __init__(self, cfg: PIIConfig, ledger: Ledger):
        super().__init__(ledger)
        self.kinds = tuple(cfg.kinds)
        self.counts: dict[str, int] = {}

    def process(self, doc: Document) -> Document:
        doc.text, counts = redact(doc.text, self.kinds)
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
            self.stats[kind] += n
            self.ledger.pii(doc.lang, kind, n)
        return doc
