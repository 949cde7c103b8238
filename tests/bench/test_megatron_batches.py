"""The benchmarks' fixed-batch baseline (bench/fixed_sampler.py) on the sampler tests' data."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.fixed_sampler import FixedBatchSampler  # noqa: E402
from training.data import ShardIndex  # noqa: E402
from training.sampler import DynamicBatchSampler  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "training"))
from test_sampler import BATCH, write_prepared  # noqa: E402


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return ShardIndex(write_prepared(tmp_path_factory.mktemp("prepared")))


def run(s, n):
    return [s.next_step() for _ in range(n)]


def test_fixed_baseline_pads_more_and_balances_worse(index):
    dp = 4
    dyn = run(DynamicBatchSampler(index, BATCH, dp_size=dp, seq_len=512, seed=7), 100)
    # the fixed baseline's global batch: about the same tokens per step (16384 / 512 = 32 samples = 8 per rank)
    fixed = run(FixedBatchSampler(index, samples_per_rank=8, dp_size=dp, seed=7), 100)
    assert all(len(rank) == 1 and len(rank[0]) == 8 for p in fixed for rank in p.ranks)
    pad_dyn = 1 - sum(p.tokens for p in dyn) / sum(p.padded_tokens for p in dyn)
    pad_fixed = 1 - sum(p.tokens for p in fixed) / sum(p.padded_tokens for p in fixed)
    bal_dyn, bal_fixed = np.mean([p.dp_balance for p in dyn]), np.mean([p.dp_balance for p in fixed])
    print(f"padding dynamic {pad_dyn:.3f} fixed {pad_fixed:.3f}; mean dp_balance dynamic {bal_dyn:.4f} fixed {bal_fixed:.4f}")
    assert pad_fixed > pad_dyn + 0.05
    assert bal_fixed > bal_dyn + 0.02


def test_fixed_baseline_resumes_and_covers_every_sample_once_per_epoch(index):
    full = run(FixedBatchSampler(index, samples_per_rank=64, dp_size=4, seed=1), 12)  # 3072 samples: wraps the 1320 rows twice
    first_epoch = [r for p in full[:5] for rank in p.ranks for mb in rank for r in mb]  # 1280 of the 1320 rows
    assert len(set(first_epoch)) == 1280
    s = FixedBatchSampler(index, samples_per_rank=64, dp_size=4, seed=1)
    run(s, 5)
    r = FixedBatchSampler(index, samples_per_rank=64, dp_size=4, seed=1)
    r.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert run(r, 7) == full[5:]
