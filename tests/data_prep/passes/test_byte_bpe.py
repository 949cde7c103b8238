"""A Hugging Face byte-level tokenizer in prepare (data_prep/passes/tokenizer.py,
data_prep/passes/byte_bpe.py): the shards hold the tokenizer.json's own ids and decode back to the
corpus's bytes, the folder keeps the files AutoTokenizer reads, BLOOM's kind trains, and a grown
tokenizer keeps every old id."""

import json
import unicodedata

from bloomline.tokenizer import open_tokenizer
from tests.support.hf_bloom import SAMPLE


def byte_of() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted: a byte-level token's characters → its bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def test_shards_hold_the_tokenizer_json_s_ids_and_decode_to_the_corpus(hf_bloom, hf_data, shard_table):
    m = json.loads((hf_data / "manifest.json").read_text())
    assert m["tokenizer"]["kind"] == "byte_bpe" and m["tokenizer"]["path"] == "tokenizer/tokenizer.json"
    for f in ("tokenizer.json", "tokenizer_config.json"):  # unchanged, beside each other
        assert (hf_data / "tokenizer" / f).read_bytes() == (hf_bloom / "model" / f).read_bytes()
    tok, inverse = open_tokenizer(hf_data / "tokenizer"), byte_of()
    corpus = "\n".join(
        unicodedata.normalize("NFC", json.loads(line)["text"])
        for f in sorted(SAMPLE.rglob("*.jsonl"))
        for line in f.read_text(encoding="utf-8").splitlines()
    ).encode("utf-8")
    pieces = 0
    for shard in m["shards"]:
        t = shard_table(hf_data, shard)
        for ids, offsets in zip(t.column("input_ids").to_pylist(), t.column("doc_offsets").to_pylist()):
            for a, b in zip(offsets, [*offsets[1:], len(ids)]):
                piece = [i for i in ids[a:b] if i != tok.eos_id]
                raw = b"".join(bytes(inverse[c] for c in tok.token(i)) for i in piece)  # a cut may split a character
                assert raw in corpus, raw[:80]
                pieces += 1
    assert pieces > 500


def test_bloom_s_kind_trains_deterministically(tmp_path):
    from data_prep.passes.byte_bpe import train_byte_bpe

    text = tmp_path / "sample.txt"
    text.write_text(
        "".join(
            json.loads(l)["text"] + "\n"
            for f in sorted(SAMPLE.glob("text/*.jsonl"))[:6]
            for l in f.read_text().splitlines()
        )
    )
    a, b = (train_byte_bpe([text], tmp_path / d, 700) for d in ("a", "b"))
    assert a.read_bytes() == b.read_bytes()
    tok = open_tokenizer(a)
    assert tok.vocab_size == 700 and tok.ids == {"unk": 0, "bos": 1, "eos": 2, "pad": 3}
    assert tok.encode("<EMAIL>") == [tok.vocab_size - 3]  # a placeholder is one token, standing for its text
