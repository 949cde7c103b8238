"""The benchmarks' fixed-batch baseline, as Megatron-LM draws batches (bench/train_throughput.py
compares bloomline's dynamic batches with it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from training.data.sampler import permutation_at, seed_words
from training.data.shard_reader import ShardIndex


class MegatronBatches:
    """Megatron-LM's GPT dataset over the same prepared data: no buckets, no padding, a constant
    number of samples per step.

    Every document of the split (the ``doc_offsets`` pieces of every shard row) is read in one
    seeded permutation per epoch; their tokens are concatenated into one stream, and each sample
    is the next ``seq_len + 1`` tokens (inputs and labels shifted by one; consecutive samples share
    one token, as in Megatron's ``GPTDataset``). Attention is causal over the whole sample, across
    document boundaries, as Megatron's default (``--reset-attention-mask`` off) computes it: the
    model gets one segment per row. A step deals ``samples_per_rank`` samples to each of ``dp``
    ranks, in micro-batches of ``micro_batch_size``.
    """

    def __init__(
        self, index: ShardIndex, samples_per_rank: int, dp_size: int, seq_len: int, seed: int, micro_batch_size: int = 1
    ):
        if samples_per_rank % micro_batch_size:
            raise ValueError("samples_per_rank must be a multiple of micro_batch_size")
        self.index, self.per_rank, self.dp, self.seq_len = index, int(samples_per_rank), int(dp_size), int(seq_len)
        self.seed, self.mbs = int(seed), int(micro_batch_size)
        docs = []  # (shard id, row, start, end) of every document
        for sid, shard in enumerate(index.shards):
            for row in range(int(shard["rows"])):
                toks, offsets = index.fetch(sid, row)
                bounds = [*offsets.tolist(), len(toks)]
                docs += [(sid, row, a, b) for a, b in zip(bounds, bounds[1:])]
        self.docs = docs
        self.epoch, self.pos, self.offset, self.step = 0, 0, 0, 0
        self.carry: int | None = None
        self._keyed: tuple[int, int] = (-1, 0)

    def _key(self, epoch: int) -> int:
        if self._keyed[0] != epoch:  # one key per epoch, derived once
            self._keyed = (
                epoch,
                int(np.random.SeedSequence([seed_words(self.seed), 3, epoch]).generate_state(1, np.uint64)[0]),
            )
        return self._keyed[1]

    def _doc(self, k: int) -> np.ndarray:
        sid, row, a, b = self.docs[int(permutation_at(np.array([k]), len(self.docs), self._key(self.epoch))[0])]
        return self.index.fetch(sid, row)[0][a:b]

    def _read(self, n: int) -> list[tuple[np.ndarray, bool]]:
        """The next ``n`` tokens of the stream, epoch after epoch, as (piece, whether it starts a document)."""
        out = []
        while n:
            doc = self._doc(self.pos)
            piece = doc[self.offset : self.offset + n]
            out.append((piece, self.offset == 0))
            n -= len(piece)
            self.offset += len(piece)
            if self.offset == len(doc):
                self.pos, self.offset = self.pos + 1, 0
                if self.pos == len(self.docs):
                    self.epoch, self.pos = self.epoch + 1, 0
        return out

    def _sample(self) -> tuple[np.ndarray, np.ndarray]:
        """``seq_len + 1`` tokens (the previous sample's last token, then ``seq_len`` new ones) and
        the document each belongs to (1, 2, … within the sample)."""
        pieces = [] if self.carry is None else [(np.array([self.carry]), True)]
        pieces += self._read(self.seq_len + 1 - len(pieces))
        toks = np.concatenate([p for p, _ in pieces]).astype(np.int64)
        doc = np.concatenate([np.eye(1, len(p), dtype=np.int64)[0] * int(new) for p, new in pieces])  # 1 at a start
        doc[0] = 1
        self.carry = int(toks[-1])
        return toks, np.cumsum(doc)

    def next_step(self) -> list[list[dict[str, torch.Tensor]]]:
        """``[rank][micro-batch]`` of tensors as training.data.shard_reader.collate gives them."""
        self.step += 1
        ranks = []
        for _ in range(self.dp):
            mbs = []
            for _ in range(self.per_rank // self.mbs):
                toks, docs = zip(*(self._sample() for _ in range(self.mbs)))
                rows = np.stack(toks)
                ids = torch.from_numpy(rows[:, :-1].copy())
                # segment_ids: one per row, what Megatron's causal mask attends over; doc_ids: the
                # documents really there (for counting what crosses them)
                mbs.append(
                    {
                        "input_ids": ids,
                        "labels": torch.from_numpy(rows[:, 1:].copy()),
                        "segment_ids": torch.ones_like(ids),
                        "lengths": torch.full((self.mbs,), self.seq_len),
                        "doc_ids": torch.from_numpy(np.stack(docs)[:, :-1].copy()),
                    }
                )
            ranks.append(mbs)
        return ranks

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "step": self.step,
            "epoch": self.epoch,
            "pos": self.pos,
            "offset": self.offset,
            "carry": self.carry,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.pos, self.offset = (int(state[k]) for k in ("step", "epoch", "pos", "offset"))
        self.carry = state["carry"]
