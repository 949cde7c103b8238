"""bloomline/tokenizer.py: a byte-level tokenizer.json read as its library reads it, bytes per token
exact, and the tokenizers that would miscount bits per byte refused in one line."""

import json

import numpy as np
import pytest

from bloomline.tokenizer import PROBE, TokenizerError, open_tokenizer, tokenizer_file


def test_byte_level_ids_are_the_library_s_and_bytes_add_up(hf_bloom):
    from transformers import AutoTokenizer

    tok = open_tokenizer(hf_bloom / "tok")
    hf = AutoTokenizer.from_pretrained(str(hf_bloom / "model"), local_files_only=True)
    assert tok.kind == "byte_bpe" and tok.ids == {"unk": 0, "bos": 1, "eos": 2, "pad": 3}
    nbytes = tok.token_bytes()
    for text in [PROBE, "naïve café — 東京 🙂", "  x\n\n\ty  "]:
        ids = tok.encode(text)
        assert ids == hf(text)["input_ids"]
        assert tok.decode(ids) == text and int(nbytes[ids].sum()) == len(text.encode("utf-8"))
    enc = tok.encode_batch(["ab", ""])
    assert [a.dtype for a in enc] == [np.int32, np.int32] and enc[1].tolist() == [2]  # </s> ends each
    assert enc[0].tolist() == [*tok.encode("ab"), 2]
    assert nbytes[:4].tolist() == [0, 0, 0, 0]  # the specials stand for no text


def edited(hf_bloom, tmp_path, edit):
    spec = json.loads((hf_bloom / "tok" / "tokenizer.json").read_text())
    edit(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    return tmp_path


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda s: s["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True), "does not give back"),
        (lambda s: s.update(normalizer={"type": "Lowercase"}), "does not give back"),
        (
            lambda s: s.update(
                decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
            ),
            "not byte-level",
        ),
        (lambda s: s["added_tokens"].pop(2) and s["model"]["vocab"].pop("</s>"), "no </s>"),
        (lambda s: s.update(model="nonsense"), "cannot load"),
    ],
)
def test_a_tokenizer_that_would_miscount_is_refused_in_one_line(hf_bloom, tmp_path, edit, says):
    with pytest.raises(TokenizerError, match=says) as e:
        open_tokenizer(edited(hf_bloom, tmp_path, edit))
    assert "\n" not in str(e.value)


def test_a_folder_names_its_tokenizer(hf_bloom, tmp_path):
    assert tokenizer_file(hf_bloom / "model").name == "tokenizer.json"
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        tokenizer_file(tmp_path)
