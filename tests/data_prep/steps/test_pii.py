import pytest

from data_prep.steps.pii import redact


@pytest.mark.parametrize(
    "text,kind",
    [
        ("write to jane.doe+news@example.co.uk today", "email"),
        ("server at 192.168.10.254 is down", "ip_address"),
        ("ipv6 2001:db8:85a3::8a2e:370:7334 ok", "ip_address"),
        ("call +44 20 7946 0958 now", "phone"),
        ("call (555) 123-4567 now", "phone"),
        ("call 555-123-4567 now", "phone"),
        ("simu +255 712 345 678 kesho", "phone"),
    ],
)
def test_redacts(text, kind):
    out, counts = redact(text)
    assert counts == {kind: 1}
    assert f"<{kind.upper()}>" in out


@pytest.mark.parametrize(
    "text",
    [
        "version 1.2.3.4.5 released in 2021",
        "meeting at 12:30 on 2023-05-17",
        "std::vector<int> v; a::b::c",
        "order id 1234567890123 and year 1999",
        "pi is 3.14159265 and e is 2.71828",
        "x = [1, 2, 3]; y = 10.0.0",
        "user@localhost has no tld",
    ],
)
def test_leaves_non_pii_alone(text):
    out, counts = redact(text)
    assert counts == {} and out == text


def test_counts_several():
    out, counts = redact("a@b.org and c@d.net at 10.0.0.1")
    assert counts == {"email": 2, "ip_address": 1}
    assert out == "<EMAIL> and <EMAIL> at <IP_ADDRESS>"


def plain_redact(text: str) -> tuple[str, dict[str, int]]:
    """The redaction as first written: each pattern, without its lookahead prefix, substituted
    over the whole text, with no number-run or colon shortcut."""
    import re

    from data_prep.steps import pii

    ip = re.compile(pii._IP.pattern.replace(r"(?=[\d:A-Fa-f])", "", 1))
    phone = re.compile(pii._PHONE.pattern.replace(r"(?=[+(\d])", "", 1))
    assert ip.pattern != pii._IP.pattern and phone.pattern != pii._PHONE.pattern
    counts = {"email": 0, "ip_address": 0, "phone": 0}

    def ip_sub(m):
        if ":" in m.group(0) and not pii._ipv6_ok(m):
            return m.group(0)
        counts["ip_address"] += 1
        return pii.PLACEHOLDERS["ip_address"]

    def phone_sub(m):
        s, d = m.group(0), pii._digits(m.group(0))
        if (s.startswith("+") and 8 <= d <= 15) or (not s.startswith("+") and 9 <= d <= 15):
            counts["phone"] += 1
            return pii.PLACEHOLDERS["phone"]
        return s

    text, counts["email"] = pii._EMAIL.subn(pii.PLACEHOLDERS["email"], text)
    text = phone.sub(phone_sub, ip.sub(ip_sub, text))
    return text, {k: v for k, v in counts.items() if v}


def test_the_fast_patterns_match_as_the_plain_ones():
    """The lookahead prefixes, the IPv4-only search and the search of number runs only change
    where sre looks, not what it finds: the plain redaction gives the same, on text dense in
    digits, separators, colons and hex letters."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.text(alphabet="0123456789 .:-+()abcfx@", max_size=80))
    @example("1::2.3.4.5")  # two colons: the IPv6 branch matches "1::2" first, so no IPv4 here
    @example("+12345678 (123)456-7890 1.2.3.4")
    @example("a+12345678 x(123)456-7890 1.2.3.4.5 +(12) 3456 7890")
    @example("1:2:3:4:5:6:7:8 1.2.3.4")  # exactly seven colons and no "::": IPv6 looked for
    @example("x@a.bc_d y@a.bcé")  # a word character after the domain: no address
    @example(
        "x@a.bc d@e@f.gh " + "a" * 64 + "@b.cd a" + "b" * 64 + "@c.de"
    )  # two "@" in a window; 64-character local parts
    @example("x FE80::1:2 a::b 1.1.2.3.4")  # upper-case hex; a dotted number too long for an address
    @example("at 1.2.3.4")  # the shortest run an address makes
    @example("555 123 4567a")  # the letter after the run is what stops the phone here
    def check(text):
        assert redact(text) == plain_redact(text)

    check()


def test_a_colon_run_is_scanned_in_memory_of_its_runs_not_its_matches():
    """1 MiB of ``:`` holds a seed match every other character: the runs are merged as the matches
    come, so the search holds O(runs), not the 512Ki matches (60 MiB when they were sorted)."""
    import tracemalloc

    text = ":" * (1 << 20) + " 10.0.0.1 " + "::" * 1000
    tracemalloc.start()
    try:
        out, counts = redact(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (out, counts) == plain_redact(text) and counts == {"ip_address": 1}
    assert peak < 4 * len(text), f"{peak / 2**20:.1f} MiB"  # the output string itself is ~1 MiB
