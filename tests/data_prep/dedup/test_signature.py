import numpy as np
import pytest

from data_prep.config import DedupConfig
from data_prep.dedup.signature import band_hashes, band_params, exact_key, minhash, shingles


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
