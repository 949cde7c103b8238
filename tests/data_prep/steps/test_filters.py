import pytest

from data_prep.config import FilterConfig, QualityThresholds
from data_prep.steps.document import Document, Ledger
from data_prep.steps.filters import QualityFilter, first_failure, quality_scores
from data_prep.steps.scores import TextBatch, char_repetition_ratios, special_ratios, word_repetition_ratios, words

GOOD = (
    "Every morning the baker opens her shop before sunrise. She kneads the dough, lights the oven and "
    "arranges fresh loaves on wooden shelves while the street slowly wakes up around her."
)


def char_repetition_ratio(text, n):
    return char_repetition_ratios(TextBatch([text]), n)[0]


def word_repetition_ratio(text, n):
    return word_repetition_ratios(TextBatch([text]), n)[0]


def quality_reason(text, t, han_chars=False):
    """The first check ``text`` fails under thresholds ``t``, or None (the filter's own decision)."""
    failed = first_failure(quality_scores(text, t, han_chars), t)
    return failed[0] if failed else None


def test_definitions_match_roots():
    # ROOTS' code on "ok_ok_good_ok" with n=3 gives 4/11 (k capped by the repeated n-grams).
    assert char_repetition_ratio("ok_ok_good_ok", 3) == pytest.approx(4 / 11)
    assert word_repetition_ratio("a b c d e f", 2) == 0.0
    assert words("«Hello», world!! 123 ...") == ["Hello", "world"]  # digits are special in ROOTS
    assert words("我们去市场", han_chars=True) == list("我们去市场")
    assert special_ratios(TextBatch(["a1 !", "", "ab"])).tolist() == [0.75, 0.0, 0.0]


@pytest.mark.parametrize(
    "text,reason",
    [
        ("too short here", "too_few_words"),
        ("buy now " * 40, "char_repetition"),
        (
            GOOD + " $$$ ### @@@ %%% &&& *** ((( ))) 1234567890 1234567890 1234567890 1234567890 !!! ??? ;;; ::: ---",
            "special_characters",
        ),
        (GOOD + " porn porn xxx porn", "flagged_words"),
    ],
)
def test_each_reason(text, reason):
    t = QualityThresholds(flagged_words=["porn", "xxx"], max_flagged=0.05, max_char_rep=0.2)
    assert quality_reason(GOOD, t) is None
    assert quality_reason(text, t) == reason


def test_word_repetition_counts_the_copies_by_characters():
    """Gopher's duplicate n-gram character fraction: a phrase's first use is not repetition, its
    copies are (ROOTS' ratio gives 1.0 for both texts below), and words weigh by their length."""
    assert word_repetition_ratio("a b c a b c a b c", 3) == pytest.approx(6 / 9)
    assert word_repetition_ratio("one two three one two three", 3) == pytest.approx(0.5)
    # the repeated phrase is three short words (6 characters) of a text of 29
    assert word_repetition_ratio("xx ab to xx ab to yyyyyyyy zzzzzzzzz", 3) == pytest.approx(6 / 29)


def test_word_repetition_reason():
    t = QualityThresholds(max_char_rep=1.0, max_word_rep=0.3)
    text = GOOD + " " + " ".join(["the market opens at dawn today"] * 6)
    assert quality_reason(text, t) == "word_repetition"


def test_per_language_thresholds_and_code_checks():
    cfg = FilterConfig(languages={"en": {"min_words": 50}})
    ledger = Ledger()
    step = QualityFilter(cfg, ledger)
    docs = [
        Document(GOOD, "en", "1", "f:1"),
        Document(GOOD, "fr", "2", "f:2"),
        Document("x = 1\n", "code-python", "3", "f:3"),
        Document("y" * 2000 + "\n" + "z = 2\n" * 30, "code-c", "4", "f:4"),
        Document("def f(x):\n    return x + 1\n\n" * 10, "code-python", "5", "f:5"),
    ]
    out = [d.id for d in step.run(docs)]
    assert out == ["2", "5"]
    led = ledger.to_dict()
    assert led["en"]["filtered"] == {"too_few_words": 1}
    assert led["code-python"]["filtered"] == {"too_short": 1}
    assert led["code-c"]["filtered"] == {"long_lines": 1}


def test_real_corpus_mostly_passes(shared_corpus):
    """The demo recipe's thresholds keep most real documents of a few languages."""
    import json
    from pathlib import Path

    from bloomline.config import load_config
    from data_prep.config import PrepareConfig

    cfg = load_config(PrepareConfig, Path(__file__).resolve().parents[3] / "configs/data/demo.yaml")
    for lang in ("en", "fr", "hi", "zh-Hans", "sw", "yo"):
        lines = (shared_corpus / "text" / f"{lang}.jsonl").read_text().splitlines()[:60]
        t = cfg.filters.for_language(lang)
        kept = sum(quality_reason(json.loads(l)["text"], t, han_chars=lang.startswith("zh")) is None for l in lines)
        assert kept / len(lines) >= 0.9, (lang, kept)


def test_languages_written_without_spaces_count_their_letters_as_words(shared_corpus):
    """Thai, Japanese: a language BLOOM never saw, with no thresholds of its own, is filtered with
    ROOTS' defaults, its words its letters (as Chinese's): real text is kept. Split on spaces alone,
    every Japanese document had fewer than 10 words."""
    import json

    from bloomline import languages
    from data_prep.steps.text import unspaced_letters

    extra = shared_corpus.parent / "corpus-extra" / "text"
    if not extra.is_dir():
        pytest.skip("../shared/corpus-extra not present")
    assert words("สวัสดีครับ, ผม", unspaced_letters("Thai")) == list("สวัสดีครับผม")
    assert words("東京へ行く。 Tokyo!", unspaced_letters("Jpan")) == [*"東京へ行く", "Tokyo"]
    for lang in ("th", "ja", "de", "ko"):
        lines = (extra / f"{lang}.jsonl").read_text().splitlines()[:60]
        letters = unspaced_letters(languages.get(lang).script) or False
        kept = sum(quality_reason(json.loads(l)["text"], QualityThresholds(), letters) is None for l in lines)
        assert kept / len(lines) >= 0.9, (lang, kept)


def test_the_check_table_is_the_one_list_of_checks():
    """Each check is one row (data_prep/steps/filters.py Check); the scores recorded, the derived
    thresholds and the recipe's validation read it, so a new row reaches all of them."""
    from dataclasses import fields

    from data_prep.calibration import thresholds
    from data_prep.config import CodeThresholds
    from data_prep.steps.filters import CHECKS, CODE_CHECKS, SCORES
    from data_prep.storage.droplog import SCORE_SCHEMA

    for checks, cls in ((CHECKS, QualityThresholds), (CODE_CHECKS, CodeThresholds)):
        names = {f.name for f in fields(cls)}
        assert all(c.limit in names for c in checks)
        assert [c.default(cls) for c in checks] == [getattr(cls(), c.limit) for c in checks]
    assert len({c.reason for c in CHECKS + CODE_CHECKS}) == len(CHECKS + CODE_CHECKS)
    assert [f.name for f in SCORE_SCHEMA][2:] == list(SCORES)
    assert thresholds.CHECKS == {
        "char_rep": "max_char_rep",
        "word_rep": "max_word_rep",
        "special": "max_special",
        "keyboard": "max_keyboard",
    }
    assert set(quality_scores(GOOD, QualityThresholds())) == {c.score for c in CHECKS}
    with pytest.raises(Exception, match="max_keyboard"):
        QualityThresholds(max_keyboard=1.5).validate()


# -- the vectorised scores equal their plain definitions ---------------------------------------
def plain_char_repetition(text, n):
    """ROOTS' definition, as a Counter of the string's n-grams."""
    import math
    from collections import Counter

    counts = Counter(text[i : i + n] for i in range(len(text) - n + 1))
    if not counts:
        return 0.0
    freqs = sorted(counts.values(), reverse=True)
    k = min(int(math.sqrt(len(freqs))), sum(1 for f in freqs if f > 1))
    return sum(freqs[:k]) / sum(freqs)


def plain_word_repetition(ws, n):
    """Gopher's duplicate n-gram character fraction, as a scan over tuples of words."""
    lowered = [w.lower() for w in ws]
    total, seen, repeated, i = sum(map(len, lowered)), set(), 0, 0
    while i <= len(lowered) - n:
        gram = tuple(lowered[i : i + n])
        if gram in seen:
            repeated, i = repeated + sum(map(len, gram)), i + n
        else:
            seen.add(gram)
            i += 1
    return repeated / total if total else 0.0


def plain_words(text, han_chars=False):
    from data_prep.steps.text import is_han, is_special, strip_edges

    out = []
    for w in text.split():
        w = strip_edges(w, is_special)
        if w and han_chars and any(is_han(c) for c in w):
            out.extend(c for c in w if not is_special(c))
        elif w:
            out.append(w)
    return out


def test_scores_equal_their_plain_definitions_on_real_text(shared_corpus):
    """Scored as one batch (data_prep/steps/scores.py): each document's scores are its own, whatever
    stands before or after it in the batch."""
    from data_prep.steps.text import is_special

    texts = []
    for f in (
        sorted((shared_corpus / "text").glob("*.jsonl"))[::3]
        + sorted((shared_corpus / "text").glob("zh-*.jsonl"))
        + sorted((shared_corpus / "code").glob("*.jsonl"))[:2]
    ):
        texts += [__import__("json").loads(x)["text"] for x in f.read_text(encoding="utf-8").splitlines()[:8]]
    texts += ["", "a", "ab ab ab ab ab ab"]  # shorter than an n-gram, and all repetition
    for han in (False, True):
        batch = TextBatch(texts, han)
        assert batch.words == [plain_words(t, han) for t in texts]
        assert special_ratios(batch).tolist() == [sum(map(is_special, t)) / max(1, len(t)) for t in texts]
        for n in (3, 10):
            assert char_repetition_ratios(batch, n).tolist() == [plain_char_repetition(t, n) for t in texts]
        assert word_repetition_ratios(batch, 5).tolist() == [plain_word_repetition(ws, 5) for ws in batch.words]


def test_scores_equal_their_plain_definitions_on_repetitive_text():
    """Texts from a tiny alphabet repeat n-grams everywhere: every path of the scans is taken,
    on batches of texts (a repeat in one document must not count in its neighbour)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None, derandomize=True)
    # spaces str.split() cuts at beside " " (a tab, an information separator, NBSP, the ideographic
    # space) and a special character that is no space (the zero-width space)
    @given(
        st.lists(st.text(alphabet="ab .İ!\t\x1c\xa0\u3000\u200b", max_size=80), min_size=1, max_size=4),
        st.integers(1, 13),
    )
    def check(texts, n):
        batch = TextBatch(texts)
        assert char_repetition_ratios(batch, n).tolist() == [plain_char_repetition(t, n) for t in texts]
        assert batch.words == [plain_words(t) for t in texts]
        m = min(n, 6)
        assert word_repetition_ratios(batch, m).tolist() == [plain_word_repetition(ws, m) for ws in batch.words]

    check()
