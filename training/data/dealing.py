"""Dealing one step's drawn samples to the data-parallel ranks and their micro-batches, and the
:class:`StepPlan` that results (what the sampler, training/data/sampler.py, hands the trainer).

Why load balancing: data-parallel ranks wait for each other at every gradient all-reduce, so a
step is as slow as its slowest rank. All ranks run the same number of micro-batches of the same
shape (DeepSpeed's pipeline and ZeRO need that); within that constraint the drawn samples are
dealt so that every rank's cost (training/planning/flops.py: padded length + w·Σ dᵢ(dᵢ+1)/2 over the
sample's documents, w the model's FLOPs of one attended pair over one position's linear FLOPs)
is as equal as possible. With the ``flex`` kernel that is what the ranks compute (tiles across
documents are skipped); with ``sdpa`` every sample of a bucket costs the same dense work, and the
dealing changes nothing. The trainer reports the balance of the work really computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from training.data.shard_reader import SampleRef


@dataclass
class StepPlan:
    """What every data-parallel rank trains on in one optimizer step.

    ``ranks[r][g]`` is micro-batch ``g`` of rank ``r``: a list of ``(shard_id, row)``; every
    micro-batch of the step has the same number of samples, and ``pad_lengths[r][g]`` is the
    length it is padded to (the step's ``bucket`` for the dynamic sampler).
    """

    step: int
    bucket: int
    micro_batch_size: int
    gas: int
    ranks: list[list[list[SampleRef]]]
    tokens: int
    """Σ real lengths of all samples of the step (all ranks)."""
    padded_tokens: int
    """Σ padded lengths (what is computed)."""
    padding_fraction: float
    cost_balance: float
    """max / mean over ranks of the cost model the samples were dealt by (1.0 = perfect); the
    trainer's ``dp_balance`` is the same ratio of the work the kernels computed."""
    lr_scale: float
    lang_tokens: dict[str, int]
    budget: int = 0
    """The step's token budget (after ramp-up); 0 for the fixed baseline."""
    pad_lengths: list[list[int]] = field(default_factory=list)


def build_plan(
    step: int,
    refs: list[SampleRef],
    lengths: np.ndarray,
    langs: Sequence[str],
    assignment: list[list[list[int]]],
    pad_lengths: list[list[int]],
    cost: np.ndarray,
    lr_scale: float,
    budget: int,
) -> StepPlan:
    """Turn an assignment of sample indices ([dp][gas][m]) into a StepPlan with its statistics."""
    tokens = int(lengths.sum())
    padded = sum(len(mb) * pl for rank, pls in zip(assignment, pad_lengths) for mb, pl in zip(rank, pls))
    loads = np.array([sum(cost[i] for mb in rank for i in mb) for rank in assignment])
    lang_tokens: dict[str, int] = {}
    for lg, ln in zip(langs, lengths):
        lang_tokens[lg] = lang_tokens.get(lg, 0) + int(ln)
    return StepPlan(
        step=step,
        bucket=max(max(p) for p in pad_lengths),
        micro_batch_size=len(assignment[0][0]),
        gas=len(assignment[0]),
        ranks=[[[refs[i] for i in mb] for mb in rank] for rank in assignment],
        tokens=tokens,
        padded_tokens=padded,
        padding_fraction=1.0 - tokens / padded,
        cost_balance=float(loads.max() / loads.mean()),
        lr_scale=lr_scale,
        lang_tokens=dict(sorted(lang_tokens.items())),
        budget=budget,
        pad_lengths=pad_lengths,
    )


def balance(cost: np.ndarray, dp: int, per_rank: int, tolerance: float) -> list[list[int]]:
    """Deal ``dp·per_rank`` samples to ``dp`` ranks, exactly ``per_rank`` each, evening out compute.

    1. Greedy LPT under the cardinality constraint: samples in descending cost, each to the
       least-loaded rank that still has room.
    2. Pairwise swaps: while the most-loaded rank A is above ``(1 + tolerance)·mean``, swap one
       of its samples with one of another rank B (least-loaded first) whose cost difference
       δ lies in (0, load_A − load_B) — that lowers max(load_A, load_B) — choosing δ closest to
       half the gap. Stops when balanced or when no swap with A helps.

    Deterministic: stable sorts, ties to the lowest index.
    """
    n = len(cost)
    assert n == dp * per_rank, (n, dp, per_rank)
    order = np.argsort(-cost, kind="stable")
    members: list[list[int]] = [[] for _ in range(dp)]
    loads = np.zeros(dp)
    for i in order:
        room = np.where(np.array([len(m) < per_rank for m in members]), loads, np.inf)
        r = int(room.argmin())
        members[r].append(int(i))
        loads[r] += cost[i]
    if dp == 1:
        return members
    target = (1.0 + tolerance) * loads.mean()
    for _ in range(4 * n):
        a = int(loads.argmax())
        if loads[a] <= target:
            break
        ca = cost[members[a]]
        for b in np.argsort(loads, kind="stable"):
            b = int(b)
            gap = loads[a] - loads[b]
            if b == a or gap <= 0:
                continue
            delta = ca[:, None] - cost[members[b]][None, :]
            ok = (delta > 0) & (delta < gap)
            if not ok.any():
                continue
            score = np.where(ok, np.abs(delta - gap / 2), np.inf)
            i, j = np.unravel_index(int(score.argmin()), score.shape)
            d = delta[i, j]
            members[a][i], members[b][j] = members[b][j], members[a][i]
            loads[a] -= d
            loads[b] += d
            break
        else:
            break  # no swap with the most-loaded rank helps
    return members


def split_micro_batches(members: list[int], cost: np.ndarray, gas: int) -> list[list[int]]:
    """Split one rank's samples into ``gas`` micro-batches of equal size and similar cost.

    Snake order over the samples sorted by cost (0,1,…,g−1,g−1,…,0,…) gives every micro-batch
    the same count and nearly the same compute, which keeps pipeline stages evenly busy.
    """
    ranked = sorted(members, key=lambda i: (-cost[i], i))
    out: list[list[int]] = [[] for _ in range(gas)]
    for k, i in enumerate(ranked):
        rnd, pos = divmod(k, gas)
        out[pos if rnd % 2 == 0 else gas - 1 - pos].append(i)
    return out
