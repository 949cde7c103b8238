"""The benchmarks' baseline sampler: a fixed number of samples per rank per step, as
Megatron-style trainers draw them (bench/train_throughput.py compares bloomline's dynamic
batches with it)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from training.data import ShardIndex
from training.sampler import StepPlan, seed_words, build_plan, cost_estimate, permutation_at, take_epochs


class FixedBatchSampler:
    """A fixed number of samples per rank per step, no blend, no balancing.

    All samples of all buckets and languages are read in one seeded permutation per epoch; each
    step takes the next ``samples_per_rank·dp`` and deals them round-robin (sample ``i`` to rank
    ``i mod dp``); each rank runs them as one micro-batch padded to the longest bucket among its
    samples. Same :class:`~training.sampler.StepPlan` statistics as the dynamic sampler
    (``lr_scale`` is always 1, ``budget`` 0).
    """

    def __init__(self, index: ShardIndex, samples_per_rank: int, dp_size: int, seed: int,
                 seq_len: Optional[int] = None, attn_weight: float = 1.0):
        self.index, self.per_rank, self.dp, self.seed = index, int(samples_per_rank), int(dp_size), int(seed)
        self.seq_len = int(seq_len or max(index.buckets))
        self.attn_weight = attn_weight
        streams = list(index.streams.values())
        located = [s.locate(np.arange(s.size)) for s in streams]
        self.sids = np.concatenate([a for a, _ in located])
        self.rows = np.concatenate([b for _, b in located])
        self.lengths = index.lengths(self.sids, self.rows)
        self.buckets = np.concatenate([np.full(s.size, s.bucket) for s in streams])
        self.langs = np.concatenate([np.full(s.size, s.lang, dtype=object) for s in streams])
        self.step, self.epoch, self.pos = 0, 0, 0

    def next_step(self) -> StepPlan:
        n = len(self.lengths)
        key = lambda e: int(np.random.SeedSequence([seed_words(self.seed), 2, e]).generate_state(1, np.uint64)[0])  # noqa: E731
        idx, self.epoch, self.pos = take_epochs(n, self.epoch, self.pos, self.per_rank * self.dp,
                                                lambda e, at: permutation_at(at, n, key(e)))
        lengths = self.lengths[idx]
        cost = cost_estimate(lengths, self.attn_weight, self.seq_len)
        assignment = [[list(range(r, len(idx), self.dp))] for r in range(self.dp)]
        pad = [[int(self.buckets[idx[mb]].max()) for mb in rank] for rank in assignment]
        refs = [(int(a), int(b)) for a, b in zip(self.sids[idx], self.rows[idx])]
        self.step += 1
        return build_plan(self.step, refs, lengths, list(self.langs[idx]), assignment, pad, cost, 1.0, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "step": self.step, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.pos = int(state["step"]), int(state["epoch"]), int(state["pos"])
