import pytest

from data_prep.passes.alpha import alpha_weights
from data_prep.passes.tokenizer import TokenizerError, train


def test_alpha_weights():
    w = alpha_weights({"en": 900, "sw": 100}, 1.0)
    assert w == pytest.approx({"en": 0.9, "sw": 0.1})
    w = alpha_weights({"en": 900, "sw": 100}, 0.3)
    assert w["sw"] > 0.1 and sum(w.values()) == pytest.approx(1.0)
    assert alpha_weights({"a": 1, "b": 1}, 0.3) == pytest.approx({"a": 0.5, "b": 0.5})


def test_vocab_too_large_is_a_clear_message(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("a small corpus with few words\n" * 50)
    with pytest.raises(TokenizerError, match=r"tokenizer.vocab_size=5000 is too large.*at most \d+"):
        train([f], tmp_path / "m", 5000, 0.9995, 1, 0)


def test_trains_bpe_with_byte_fallback_and_bloom_ids(tmp_path):
    import sentencepiece as spm

    f = tmp_path / "s.txt"
    f.write_text(
        "\n".join(f"line {i} with some words and <EMAIL> tokens, plus code: def f(x): return x" for i in range(300))
    )
    model = train([f], tmp_path / "m", 350, 0.9995, 1, 0)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    assert len(sp.encode("<EMAIL>")) <= 2  # user-defined symbol (plus the leading space piece)
    ids = sp.encode("ñ 漢字")  # never seen: byte fallback, no <unk>
    assert 0 not in ids and sp.decode(ids) == "ñ 漢字"
    assert sp.decode(sp.encode("    indented\tcode")) == "    indented\tcode"  # whitespace preserved


def test_model_bytes_do_not_depend_on_paths(tmp_path):
    """Resumed runs write to other folders than reference runs: the model must not embed paths."""
    f = tmp_path / "s.txt"
    f.write_text("\n".join(f"sentence {i} of a tiny corpus for the tokenizer" for i in range(200)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "c").mkdir(parents=True)
    m1 = train([f], tmp_path / "a" / "m", 300, 0.9995, 2, 0)
    m2 = train([f], tmp_path / "b" / "c" / "other", 300, 0.9995, 2, 0)
    assert m1.read_bytes() == m2.read_bytes()
    assert str(tmp_path).encode() not in m1.read_bytes()
