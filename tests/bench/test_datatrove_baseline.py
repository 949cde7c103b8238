"""The datatrove baseline's tokenizer (tests/support/datatrove_baseline.py): the SentencePiece model in its
Hugging Face ``tokenizers`` form gives the same ids on every document of the sample corpus, so
the baseline tokenizes exactly what bloomline does. The pipeline itself needs the optional
``bench`` extra (datatrove) and runs when it is installed."""

import json

import pytest

from tests.support import REPO
from tests.support.datatrove_baseline import spm_to_tokenizers


def texts():
    from data_prep.steps.normalize import normalize_text

    return [
        normalize_text(json.loads(l)["text"])
        for f in sorted((REPO / "data_prep/sample_corpus").rglob("*.jsonl"))
        for l in f.read_text(encoding="utf-8").splitlines()
    ]


def test_tokenizers_form_gives_sentencepiece_ids(demo_data, tmp_path):
    import sentencepiece as spm
    from tokenizers import Tokenizer

    model = demo_data / "tokenizer" / "tokenizer.model"
    fast = Tokenizer.from_file(str(spm_to_tokenizers(model, tmp_path / "tokenizer.json")))
    sp = spm.SentencePieceProcessor(model_file=str(model))
    docs = texts()
    assert len(docs) > 100
    differ = [t[:60] for t in docs if sp.encode(t) != fast.encode(t, add_special_tokens=False).ids]
    assert not differ, differ[:3]


def test_datatrove_pipeline_runs_the_same_steps(demo_data, tmp_path):
    pytest.importorskip("datatrove")
    pytest.importorskip("spacy")
    from tests.support.datatrove_baseline import run

    src = tmp_path / "in"
    src.mkdir()
    lines = [json.dumps({"id": str(i), "text": t}) for i, t in enumerate(texts())]
    (src / "a.jsonl").write_text("\n".join(lines + lines[:5]) + "\n")  # 5 exact duplicates
    tok = spm_to_tokenizers(demo_data / "tokenizer" / "tokenizer.model", tmp_path / "tokenizer.json")
    res = run(str(src), tmp_path / "out", str(tok), 1)
    assert res["documents"] == len(lines) + 5 and res["kept"] <= len(lines) and res["tokens"] > 0
