import pytest

from data_prep.pii import redact


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


def test_the_fast_patterns_match_as_the_plain_ones():
    """The lookahead prefixes, the IPv4-only search and the number-run check change where sre
    looks, not what it finds: the plain patterns (as written before them) redact the same, on text dense in digits,
    separators, colons and hex letters."""
    import re

    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from data_prep import pii

    plain_ip = re.compile(pii._IP.pattern.replace(r"(?=[\d:A-Fa-f])", "", 1))
    plain_phone = re.compile(pii._PHONE.pattern.replace(r"(?=[+(\d])", "", 1))
    assert plain_ip.pattern != pii._IP.pattern and plain_phone.pattern != pii._PHONE.pattern

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.text(alphabet="0123456789 .:-+()abcfx@", max_size=60))
    @example("1::2.3.4.5")  # two colons: the IPv6 branch matches "1::2" first, so no IPv4 here
    @example("+12345678 (123)456-7890 1.2.3.4")
    def check(text):
        fast = redact(text)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pii, "_IP", plain_ip)
            mp.setattr(pii, "_IP4", plain_ip)
            mp.setattr(pii, "_PHONE", plain_phone)
            mp.setattr(pii, "_NUMBER_RUN", re.compile(""))  # found in every text: both patterns always run
            assert fast == redact(text)

    check()
