"""The benchmarks' Megatron-style baseline (tests/support/fixed_sampler.py) on the sampler tests' synthetic
prepared data (tests/support/prepared.py)."""

import json

import numpy as np
import pytest
import torch

from tests.support.fixed_sampler import MegatronBatches
from tests.support.prepared import write_prepared
from training.data.shard_reader import ShardIndex


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return ShardIndex(write_prepared(tmp_path_factory.mktemp("prepared")))


def run(s, n):
    return [s.next_step() for _ in range(n)]


def stream(steps):
    """The token stream the samples cut, rebuilt from the samples (inputs, then the last label)."""
    rows = [torch.cat([mb["input_ids"], mb["labels"][:, -1:]], 1) for st in steps for rank in st for mb in rank]
    rows = torch.cat(rows).numpy()
    return rows


def test_samples_are_full_windows_of_the_concatenated_documents(index):
    s = MegatronBatches(index, samples_per_rank=4, dp_size=2, seq_len=512, seed=3, micro_batch_size=2)
    steps = run(s, 3)
    assert all(len(st) == 2 and all(len(rank) == 2 for rank in st) for st in steps)
    for st in steps:
        for rank in st:
            for mb in rank:
                assert mb["input_ids"].shape == (2, 512) and (mb["segment_ids"] == 1).all()  # no padding, one segment
                assert torch.equal(mb["input_ids"][:, 1:], mb["labels"][:, :-1])
    rows = stream(steps)
    # consecutive samples share one token (Megatron's GPTDataset), and the stream is the documents
    # in the epoch's order, concatenated
    assert all(rows[i, -1] == rows[i + 1, 0] for i in range(len(rows) - 1))
    flat = np.concatenate([rows[0]] + [r[1:] for r in rows[1:]])
    r = MegatronBatches(index, samples_per_rank=4, dp_size=2, seq_len=512, seed=3)
    docs = np.concatenate([r._doc(k) for k in range(400)])
    assert len(docs) > len(flat)
    assert np.array_equal(flat, docs[: len(flat)])


def test_resume_is_exact(index):
    s = MegatronBatches(index, samples_per_rank=2, dp_size=2, seq_len=512, seed=1)
    full = run(MegatronBatches(index, samples_per_rank=2, dp_size=2, seq_len=512, seed=1), 6)
    run(s, 2)
    r = MegatronBatches(index, samples_per_rank=2, dp_size=2, seq_len=512, seed=1)
    r.load_state_dict(json.loads(json.dumps(s.state_dict())))
    got = run(r, 4)
    for a, b in zip(got, full[2:]):
        for ra, rb in zip(a, b):
            for x, y in zip(ra, rb):
                assert all(torch.equal(x[k], y[k]) for k in x)


def test_doc_ids_mark_the_documents_in_each_sample(index):
    s = MegatronBatches(index, samples_per_rank=1, dp_size=1, seq_len=512, seed=5)
    mb = s.next_step()[0][0]
    r = MegatronBatches(index, samples_per_rank=1, dp_size=1, seq_len=512, seed=5)
    lengths, n = [], 0
    while n < 513:
        lengths.append(len(r._doc(len(lengths))))
        n += lengths[-1]
    want = np.repeat(np.arange(1, len(lengths) + 1), lengths)[:512]
    assert np.array_equal(mb["doc_ids"][0].numpy(), want)
