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
