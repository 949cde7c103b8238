from data_prep.config import LangIdConfig
from data_prep.steps.document import Document, Ledger
from data_prep.steps.langid import LanguageIdFilter, predict

EN = (
    "The weather was cold this morning, so the children wore their warm coats and walked "
    "quickly to school while their parents went to the market to buy bread and vegetables."
)


def run(docs):
    ledger = Ledger()
    step = LanguageIdFilter(LangIdConfig(), ledger)
    return list(step.run(docs)), ledger, step.report()


def test_model_ships_in_the_wheel():
    assert predict(EN)[0] == "en"


def test_confident_mismatch_is_filtered():
    out, ledger, rep = run([Document(EN, "fr", "1", "f:1"), Document(EN, "en", "2", "f:2")])
    assert [d.id for d in out] == ["2"]
    assert ledger.to_dict()["fr"]["filtered"] == {"lang_mismatch": 1}
    assert rep["verified"] == 1


def test_unverifiable_languages_keep_their_label_and_are_reported():
    # English text labelled Zulu: lid.176 cannot verify Zulu, so the label is trusted.
    out, _, rep = run(
        [
            Document(EN, "zu", "1", "f:1"),
            Document("print('x')\n" * 20, "code-python", "2", "f:2"),
            Document("short", "en", "3", "f:3"),
        ]
    )
    assert len(out) == 3
    assert rep["trusted_label"] == 1 and rep["trusted_languages"] == ["zu"]
    assert rep["code_skipped"] == 1 and rep["too_short_to_check"] == 1


def test_real_corpus_is_not_filtered(shared_corpus):
    import json

    for lang in ("en", "hi", "zh-Hant", "sw", "ar"):
        lines = (shared_corpus / "text" / f"{lang}.jsonl").read_text().splitlines()[:40]
        docs = [Document(json.loads(l)["text"], lang, str(i), f"x:{i}") for i, l in enumerate(lines)]
        out, _, _ = run(docs)
        assert len(out) == len(docs), lang
