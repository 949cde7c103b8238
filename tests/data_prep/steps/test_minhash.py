import numpy as np
import pytest

from data_prep.config import DedupConfig
from data_prep.steps.minhash import band_hashes, band_params, exact_key, minhash, shingles


def test_exact_normalization():
    assert exact_key("Hello, World!") == exact_key("hello   world")
    assert exact_key("hello world") != exact_key("hello world 2")


def test_han_shingles_are_characters():
    s = shingles("我们今天去市场买菜", 3, han=True)
    assert "我们今".encode() in s and len(s) == 7


def test_signature_is_deterministic():
    cfg = DedupConfig()
    a = minhash("one two three four five six seven", cfg, han=False)
    assert np.array_equal(a, minhash("one two three four five six seven", cfg, han=False))
    assert a.dtype == np.uint32 and len(a) == cfg.num_perm


def test_a_text_without_words_has_no_signature():
    """Every wordless text would share one all-maximum signature and be 'near' every other."""
    assert minhash("?! … —", DedupConfig(), han=False) is None


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("num_perm", [64, 128])
def test_band_shape_is_datasketchs(threshold, num_perm):
    from datasketch.lsh import _optimal_param

    assert band_params(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_band_keys_are_equal_exactly_where_bands_are():
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**32, size=(3, 12), dtype=np.uint32)
    sigs[1, :4] = sigs[0, :4]  # band 0 equal between docs 0 and 1
    sigs[2, 8:] = sigs[0, 8:]  # band 2 equal between docs 0 and 2
    k = band_hashes(sigs, 3, 4)
    assert k.dtype == np.uint64 and k.shape == (3, 3)
    assert k[0, 0] == k[1, 0] and k[0, 2] == k[2, 2]
    assert k[0, 1] != k[1, 1] and k[0, 1] != k[2, 1] and k[0, 0] != k[2, 0]
    assert len({int(x) for x in k[0]}) == 3  # the band index is part of the key


# -- the batched MinHash equals datasketch's, and estimates Jaccard --------------------------
def datasketch_signature(text, n, han, num_perm=128):
    """The reference: datasketch's MinHash of the shingle set, one document per object."""
    import xxhash
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=1, hashfunc=xxhash.xxh32_intdigest, scheme="affine32")
    m.update_batch(list(shingles(text, n, han)))
    return m.hashvalues.astype(np.uint32)


def test_batched_signatures_equal_datasketchs_document_by_document():
    from data_prep.steps.minhash import MinHasher, shingle_hashes

    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(400)]
    texts = [" ".join(rng.choice(vocab, size=k)) for k in (1, 3, 5, 40, 700, 3000, 9000, 2, 60)]
    texts.append("我们今天去市场买菜，然后回家做饭。")
    hans = [False] * (len(texts) - 1) + [True]
    for num_perm in (64, 128):
        sigs = MinHasher(num_perm).signatures(shingle_hashes(texts, 5, hans))
        for t, h, sig in zip(texts, hans, sigs):
            assert np.array_equal(sig, datasketch_signature(t, 5, h, num_perm))


def test_shingle_hashes_are_the_shingles_hashed():
    """Hashed a batch at a time: each text's hashes are xxh32 of its own shingles, in order,
    repeats included, whatever the texts around it (multi-byte characters, words longer than a
    slice the numpy hash takes, texts with fewer words than a shingle or none)."""
    import xxhash

    from data_prep.steps.minhash import _grams, shingle_hashes

    cases = [
        ("A b, c! d e f g a b c d e", False),
        ("我们今天去市场", True),
        ("one two", False),
        ("", False),
        ("!!! ???", False),
        ("Ça va très bien, merci — et toi ? ça va, ça va. 😀 ok " * 3, False),
        ("x" * 300 + " y z " + "é" * 200 + " w v u", False),
        ("我们今天去市场买菜，然后回家做饭。abc 123", True),
        ("短", True),
    ]
    texts, hans = [t for t, _ in cases], [h for _, h in cases]
    for got, (text, han) in zip(shingle_hashes(texts, 5, hans), cases):
        assert got.tolist() == [xxhash.xxh32_intdigest(g.encode("utf-8")) for g in _grams(text, 5, han)]
        assert set(got.tolist()) == {xxhash.xxh32_intdigest(s) for s in shingles(text, 5, han)}


def test_exact_key_is_xxh64_of_the_kept_characters():
    import unicodedata

    import xxhash

    for text in ["Hello, World! ¿Qué tal? 你好。", "tab\there\u200b and ZWSP", "ﬁ İstanbul 😀 ١٢٣"]:
        kept = "".join(c for c in text.lower() if unicodedata.category(c)[0] not in "PSZC")
        assert exact_key(text) == xxhash.xxh64_intdigest(kept.encode("utf-8"))


@pytest.mark.parametrize("jaccard", [0.2, 0.5, 0.8, 0.95])
def test_signatures_estimate_the_exact_jaccard(jaccard):
    """Pairs of documents built to a known shingle Jaccard: the share of equal signature values
    estimates it within 4 standard deviations (sd = √(J(1-J)/num_perm))."""
    cfg = DedupConfig()
    rng = np.random.default_rng(int(jaccard * 100))
    # unique words: every 5-gram is a distinct shingle; shared and own parts set the Jaccard
    words = [f"t{i}x" for i in rng.permutation(100_000)]
    shared, own = int(2000 * jaccard), int(2000 * (1 - jaccard) / 2)
    a = " ".join(words[: shared + own])
    b = " ".join(words[:shared] + words[shared + own : shared + 2 * own])
    sa, sb = shingles(a, 5, False), shingles(b, 5, False)
    exact = len(sa & sb) / len(sa | sb)
    est = float(np.mean(minhash(a, cfg, False) == minhash(b, cfg, False)))
    assert abs(est - exact) <= 4 * (exact * (1 - exact) / cfg.num_perm) ** 0.5 + 1e-9


@pytest.mark.parametrize("lang", ["th", "ja", "zh-Hans"])
def test_scripts_without_spaces_are_shingled_by_characters(lang):
    """A real Thai, Japanese or Chinese document and a copy with a few letters changed are near
    duplicates (signatures agree on most values), a different document is not: character shingles.
    As words, a Thai line is one word, and the copy would share next to nothing with it."""
    import json
    from pathlib import Path

    from data_prep.steps.document import Document, Ledger
    from data_prep.steps.minhash import DedupSigner

    root = Path(__file__).resolve().parents[4] / "shared"
    where = root / ("corpus-extra/text" if lang in ("th", "ja") else "corpus/text") / f"{lang}.jsonl"
    texts = [json.loads(l)["text"] for l in where.read_text(encoding="utf-8").splitlines()]
    doc, other = max(texts[:20], key=len), sorted(texts[:20], key=len)[-2]
    copy = "".join("X" if i % 97 == 50 else c for i, c in enumerate(doc))  # about 1% of its letters changed
    docs = [Document(t, lang, str(i), "t") for i, t in enumerate((doc, copy, other))]
    a, b, c = (d.meta["minhash"] for d in DedupSigner(DedupConfig(), Ledger()).process_batch(docs))
    assert (a == b).mean() > 0.8 and (a == c).mean() < 0.2, ((a == b).mean(), (a == c).mean())
