"""The dynamic-batch sampler and the trainer's data access, on small synthetic prepared data
(shards written by ShardWriter under the pack pass's names, a manifest as FORMAT.md says)."""

import json
import math
import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from bloomline.errors import ConfigError, DataError
from data_prep.storage.shards import CorruptShardError
from data_prep.storage.workdir import shard_path
from tests.support.prepared import BATCH, BLEND, BUCKETS, PAD, write_prepared
from training.config import BatchConfig
from training.data.sampler import DynamicBatchSampler, permutation_at
from training.data.shard_reader import ShardIndex, collate, verify_once


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("prepared"))


@pytest.fixture(scope="module")
def index(data):
    return ShardIndex(data)


def sampler(index, dp=2, seed=7, batch=BATCH, blend=None):
    return DynamicBatchSampler(index, batch, dp_size=dp, seq_len=512, seed=seed, blend=blend)


def run(s, n):
    return [s.next_step() for _ in range(n)]


def all_samples(index):
    """(shard id, row, length, bucket) of every sample, read straight from the shard files."""
    out = []
    for sid, s in enumerate(index.shards):
        with pa.memory_map(str(index.data_dir / s["path"]), "r") as f:
            lengths = pa.ipc.open_stream(f).read_all().column("length").to_pylist()
        out += [(sid, row, ln, s["bucket"]) for row, ln in enumerate(lengths)]
    return out


def stream_lengths(index):
    return {(sid, row): ln for sid, row, ln, _ in all_samples(index)}


@pytest.mark.parametrize("dp", [1, 3, 4])
def test_token_budget_and_shapes(index, dp):
    lengths = stream_lengths(index)
    bucket_of = {(sid, row): b for sid, row, _, b in all_samples(index)}
    seen_buckets = set()
    for plan in run(sampler(index, dp=dp), 60):
        b, m = plan.bucket, plan.micro_batch_size
        assert plan.budget == BATCH.tokens_per_step
        assert abs(plan.padded_tokens - plan.budget) <= dp * m * b
        assert m == max(1, BATCH.micro_batch_tokens // b) and (m * b <= BATCH.micro_batch_tokens or m == 1)
        assert len(plan.ranks) == dp
        assert all(len(rank) == plan.gas and all(len(mb) == m for mb in rank) for rank in plan.ranks)
        refs = [r for rank in plan.ranks for mb in rank for r in mb]
        assert {bucket_of[r] for r in refs} == {b}  # one bucket per step
        assert plan.padded_tokens == len(refs) * b and plan.tokens == sum(lengths[r] for r in refs)
        assert plan.padding_fraction == pytest.approx(1 - plan.tokens / plan.padded_tokens)
        assert sum(plan.lang_tokens.values()) == plan.tokens
        seen_buckets.add(b)
    assert seen_buckets == set(BUCKETS)


@pytest.mark.parametrize("dp", [2, 4])
def test_ranks_are_balanced(index, dp):
    plans = run(sampler(index, dp=dp), 200)
    balances = np.array([p.cost_balance for p in plans])
    # recompute the balance from the plan and the shard files: Σ bucket + w·Σ d(d+1)/2 per rank,
    # w = 2/seq_len when no model is given
    lengths = stream_lengths(index)

    def pairs(ref):
        offsets = list(index.fetch(*ref)[1]) + [lengths[ref]]
        return sum((b - a) * (b - a + 1) // 2 for a, b in zip(offsets, offsets[1:]))

    for plan in plans[-3:]:
        loads = [sum(plan.bucket + 2 / 512 * pairs(r) for mb in rank for r in mb) for rank in plan.ranks]
        assert plan.cost_balance == pytest.approx(max(loads) / np.mean(loads))
    print(f"dp={dp}: max cost balance {balances.max():.4f}, mean {balances.mean():.4f}")
    assert np.mean(balances <= 1.02) >= 0.99, balances.max()


def token_shares(plans):
    total = sum(p.tokens for p in plans)
    langs = {lg for p in plans for lg in p.lang_tokens}
    return {lg: sum(p.lang_tokens.get(lg, 0) for p in plans) / total for lg in langs}


@pytest.mark.parametrize("blend", [None, {"aa": 0.2, "bb": 0.2, "cc": 0.6}, {"aa": 1, "cc": 3}])
def test_language_shares_follow_the_blend(index, blend):
    plans = run(sampler(index, blend=blend), 300)
    want = {k: v / sum((blend or BLEND).values()) for k, v in (blend or BLEND).items()}
    got = token_shares(plans)
    assert set(got) == set(want)
    for lang, w in want.items():
        assert abs(got[lang] - w) <= 0.02, (lang, got[lang], w)


def test_unknown_blend_language_is_refused(index):
    with pytest.raises(DataError, match="zz"):
        sampler(index, blend={"aa": 1.0, "zz": 0.5})


def test_same_seed_same_plans_other_seed_differs(index):
    a, b, c = run(sampler(index, seed=3), 20), run(sampler(index, seed=3), 20), run(sampler(index, seed=4), 20)
    assert a == b
    assert a != c and [p.ranks for p in a] != [p.ranks for p in c]


def test_resume_from_state_dict_continues_exactly(index):
    full = run(sampler(index, dp=3), 17)
    first = sampler(index, dp=3)
    run(first, 7)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = sampler(index, dp=3)
    resumed.load_state_dict(state)
    assert run(resumed, 10) == full[7:17]
    assert [p.step for p in full[7:17]] == list(range(8, 18))


def test_resume_across_epochs(index):
    """A stream wraps into new epochs well within 150 steps for the small language; resume still matches."""
    blend = {"cc": 1.0}
    full = run(sampler(index, blend=blend), 60)
    s = sampler(index, blend=blend)
    run(s, 45)
    state = json.loads(json.dumps(s.state_dict()))
    assert any(epoch > 0 for epoch, _, _ in state["streams"].values())
    r = sampler(index, blend=blend)
    r.load_state_dict(state)
    assert run(r, 15) == full[45:]


def test_resume_refuses_another_seed(index):
    s = sampler(index, seed=1)
    run(s, 2)
    with pytest.raises(ConfigError, match="seed"):
        sampler(index, seed=2).load_state_dict(s.state_dict())


@pytest.mark.parametrize("scaling", ["linear", "sqrt", "none"])
def test_rampup_budget_and_lr_scale(index, scaling):
    batch = BatchConfig(
        tokens_per_step=16384,
        micro_batch_tokens=2048,
        rampup_start_tokens=4096,
        rampup_increment_tokens=2048,
        rampup_tokens=60_000,
        lr_scaling=scaling,
    )
    # 6 increments of 2048 from 4096 to 16384, one per 10,000 tokens consumed
    plans = run(sampler(index, dp=2, batch=batch), 40)
    consumed = 0
    for p in plans:
        assert p.budget == min(16384, 4096 + 2048 * (consumed // 10_000))
        assert abs(p.padded_tokens - p.budget) <= 2 * p.micro_batch_size * p.bucket
        ratio = p.tokens / 16384
        assert p.lr_scale == pytest.approx({"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling])
        consumed += p.tokens
    budgets = [p.budget for p in plans]
    assert budgets[0] == 4096 and budgets[-1] == 16384 and budgets == sorted(budgets)
    assert len(set(budgets)) == 7


def read_row(data, index, shard_id, row):
    with pa.memory_map(str(data / index.shards[shard_id]["path"]), "r") as f:
        t = pa.ipc.open_stream(f).read_all()
    return t.column("input_ids")[row].as_py(), t.column("doc_offsets")[row].as_py()


def test_materialize_labels_segments_and_ids(data, index):
    plan = sampler(index, dp=2, seed=11).next_step()
    mb = plan.ranks[1][0]
    # add a sample with several documents, to be sure boundaries are exercised
    multi = next((sid, row) for sid, row, _, b in all_samples(index) if b == 128 and len(index.fetch(sid, row)[1]) >= 3)
    mb = mb + [multi]
    out = collate(index, mb, 512, PAD)
    assert out["input_ids"].shape == out["labels"].shape == out["segment_ids"].shape == (len(mb), 512)
    for i, (sid, row) in enumerate(mb):
        ids, offsets = read_row(data, index, sid, row)
        n = len(ids)
        assert out["lengths"][i] == n
        assert out["input_ids"][i].tolist() == ids + [PAD] * (512 - n)
        want_labels, want_seg = [], []
        for t in range(512):
            boundary = t + 1 in offsets
            want_labels.append(ids[t + 1] if t + 1 < n and not boundary else -100)
            want_seg.append(sum(1 for o in offsets if o <= t) if t < n else 0)
        assert out["labels"][i].tolist() == want_labels
        assert out["segment_ids"][i].tolist() == want_seg
    assert out["segment_ids"][-1].max() >= 3
    assert out["input_ids"].dtype == out["labels"].dtype == out["segment_ids"].dtype == torch.int64


def test_permutation_at_is_a_seeded_bijection():
    for n in [1, 2, 3, 7, 64, 1000, 4097]:
        p = permutation_at(np.arange(n), n, key=12345)
        assert sorted(p.tolist()) == list(range(n)), n
        assert np.array_equal(permutation_at(np.arange(n), n, key=12345), p)
    a, b = permutation_at(np.arange(1000), 1000, 1), permutation_at(np.arange(1000), 1000, 2)
    assert not np.array_equal(a, b) and np.mean(a == np.arange(1000)) < 0.02  # shuffled, and another key differs
    assert np.array_equal(permutation_at(np.arange(10, 20), 1000, 1), a[10:20])  # any slice, computed alone


def test_rows_are_read_in_place(data):
    """Opening the shards and fetching rows allocates no Arrow memory: every row is a view of the
    memory-mapped file, not a copy on the heap."""
    before = pa.total_allocated_bytes()
    index = ShardIndex(data)
    toks, offsets = index.fetch(3, 5)
    assert pa.total_allocated_bytes() == before
    assert not toks.flags.owndata and toks.base is not None
    with pa.memory_map(str(data / index.shards[3]["path"]), "r") as f:
        assert toks.tolist() == pa.ipc.open_stream(f).read_all().column("input_ids")[5].as_py()


def test_corrupt_shard_is_refused_once_per_run_and_rehashed_when_it_changes(tmp_path):
    root = write_prepared(tmp_path / "data", rows={"aa": {128: 5, 256: 5, 512: 5}}, blend={"aa": 1.0})
    stamp = tmp_path / "run" / "data_verified.json"
    index = ShardIndex(root)
    assert verify_once(index, stamp) == len(index.shards) and stamp.is_file()
    assert verify_once(index, stamp) == 0  # verified for this run already: nothing hashed
    victim = root / shard_path("train", "aa", 256, 0)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))  # same size, new mtime: this one shard is hashed again
    with pytest.raises(CorruptShardError, match=r"aa-b00256-p00000\.arrow is corrupt"):
        verify_once(ShardIndex(root), stamp)
    # Split over two ranks (threads here, torch.distributed in the trainer): each hashes its share of
    # the shards and both refuse, whichever of them found the corrupt one.
    world, barrier, box, slots = 2, threading.Barrier(2), [None], [None, None]
    results: dict[int, object] = {}

    def rank_main(rank):
        def broadcast(obj):
            if rank == 0:
                box[0] = obj
            barrier.wait()
            return box[0]

        def gather(obj):
            slots[rank] = obj
            barrier.wait()
            return list(slots)

        try:
            results[rank] = verify_once(ShardIndex(root), tmp_path / "other-run.json", rank, world, broadcast, gather)
        except CorruptShardError as e:
            results[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(
        isinstance(results[r], CorruptShardError) and "aa-b00256-p00000.arrow is corrupt" in str(results[r])
        for r in range(world)
    ), results
    assert not (tmp_path / "other-run.json").exists()


def test_missing_or_truncated_shard_is_named(tmp_path):
    root = write_prepared(tmp_path, rows={"aa": {128: 5, 256: 5, 512: 5}}, blend={"aa": 1.0})
    victim = root / shard_path("train", "aa", 512, 0)
    victim.write_bytes(victim.read_bytes()[:200])
    index = ShardIndex(root)  # opens no shard yet
    sid = next(i for i, s in enumerate(index.shards) if s["bucket"] == 512)
    with pytest.raises(CorruptShardError, match=r"aa-b00512-p00000\.arrow is unreadable"):
        index.fetch(sid, 0)
    with pytest.raises(CorruptShardError, match=r"aa-b00512-p00000\.arrow is corrupt"):
        verify_once(index, tmp_path / "stamp.json")
    victim.unlink()
    with pytest.raises(CorruptShardError, match="shard missing: .*aa-b00512-p00000.arrow"):
        ShardIndex(root)
