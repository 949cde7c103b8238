import numpy as np
import pytest

from data_prep.passes.best_fit import BucketPacker


def pack(lengths, buckets, max_open=16, seed=0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(4, 1000, size=n).astype(np.int32) for n in lengths]
    p = BucketPacker(buckets, max_open=max_open)
    out = []
    for d in docs:
        out.extend(p.add(d))
    out.extend(p.flush())
    return docs, out


def check_invariants(docs, samples, buckets):
    for s in samples:
        assert s.bucket in buckets
        assert 0 < len(s.ids) <= s.bucket
        assert s.doc_offsets[0] == 0
        assert all(a < b for a, b in zip(s.doc_offsets, s.doc_offsets[1:]))
        assert s.doc_offsets[-1] < len(s.ids)
    # every token is kept exactly once: the multiset of all tokens is unchanged
    all_in = np.sort(np.concatenate(docs))
    all_out = np.sort(np.concatenate([s.ids for s in samples]))
    assert np.array_equal(all_in, all_out)


@pytest.mark.parametrize("seed", range(3))
def test_invariants_and_low_padding(seed):
    rng = np.random.default_rng(seed)
    lengths = list(rng.lognormal(5.5, 1.0, size=2000).astype(int) + 1)  # many short, some > seq_len
    buckets = [128, 256, 512, 1024]
    docs, samples = pack(lengths, buckets, max_open=64, seed=seed)
    check_invariants(docs, samples, buckets)
    used = sum(len(s.ids) for s in samples)
    padded = sum(s.bucket for s in samples)
    assert 1 - used / padded < 0.01


def test_documents_stay_whole_unless_longer_than_seq_len():
    buckets = [16, 32, 64]
    docs, samples = pack([10, 20, 30, 5, 64, 150, 3], buckets, max_open=100)
    check_invariants(docs, samples, buckets)
    # the 150-token document gives two full 64-token samples of its own
    full_single = [s for s in samples if len(s.ids) == 64 and s.doc_offsets == [0]]
    assert len(full_single) >= 3  # the 64-doc and two pieces of the 150-doc


def test_tail_is_cut_into_buckets():
    p = BucketPacker([16, 32, 64], max_open=4)
    assert p.add(np.arange(40, dtype=np.int32)) == []
    tail = p.flush()
    assert [s.bucket for s in tail] == [32, 16]
    assert [len(s.ids) for s in tail] == [32, 8]
    assert tail[1].doc_offsets == [0]


def test_best_fit_choice():
    p = BucketPacker([100], max_open=10)
    p.add(np.ones(60, np.int32))  # room 40
    p.add(np.ones(75, np.int32))  # room 25
    p.add(np.ones(20, np.int32))  # best fit: the one with room 25
    rooms = sorted(100 - o.fill for o in p._open)
    assert rooms == [5, 40]


def test_deterministic():
    _, a = pack([50, 70, 300, 20] * 50, [64, 128, 256])
    _, b = pack([50, 70, 300, 20] * 50, [64, 128, 256])
    assert [(s.bucket, s.ids.tobytes(), s.doc_offsets) for s in a] == [
        (s.bucket, s.ids.tobytes(), s.doc_offsets) for s in b
    ]


def test_flush_pads_only_the_last_sample():
    p = BucketPacker([16, 32, 64], max_open=100)
    for n in (40, 45, 50, 33, 7):  # five open samples, none full
        assert p.add(np.arange(n, dtype=np.int32)) == []
    out = p.flush()
    assert all(len(s.ids) == s.bucket for s in out[:-1])
    assert out[-1].bucket - len(out[-1].ids) < 16
    assert sum(len(s.ids) for s in out) == 40 + 45 + 50 + 33 + 7
