from bloomline import languages as L


def test_bloom_language_counts():
    assert len(L.natural()) == 46
    assert len(L.code()) == 13
    assert sum(l.group == "niger-congo" for l in L.LANGUAGES) == 22
    assert sum(l.group == "indic" for l in L.LANGUAGES) == 13
    others = {l.code for l in L.natural() if l.group == "other"}
    assert others == {"ar", "eu", "ca", "zh-Hans", "zh-Hant", "en", "fr", "id", "pt", "es", "vi"}
    assert {l.code for l in L.code()} == {
        f"code-{n}" for n in "c cpp csharp go java javascript lua php python ruby rust scala typescript".split()
    }


def test_aliases_and_unknowns():
    assert L.resolve("python") == "code-python"
    assert L.resolve("C++") == "code-cpp"
    assert L.resolve("zhs") == "zh-Hans"
    assert L.resolve("ts") == "ts"  # Xitsonga, not TypeScript
    assert L.resolve("xx") is None
    assert L.resolve("zh") is None  # ambiguous between scripts: refused


def test_published_shares():
    assert L.get("en").bloom_share == 30.04
    assert L.get("tum").bloom_share == 0.00002
    assert L.get("hi").bloom_share == 0.70
    assert L.get("java").bloom_code_files == 5407724
    nc = sum(l.bloom_share for l in L.natural() if l.group == "niger-congo" and l.bloom_share)
    assert abs(nc - 0.0353) < 1e-4  # the card: Niger-Congo family 0.03%


def test_every_language_has_script_and_family():
    for l in L.LANGUAGES:
        assert l.script and l.family and l.name
