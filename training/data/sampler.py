"""Dynamic, load-balanced batches over the prepared shards (``data_prep/FORMAT.md``).

Why dynamic batches: ``bloomline prepare`` packs samples into length buckets, so most tokens sit
in full samples of the largest bucket and the tails sit in smaller buckets. A fixed number of
samples per step would pad every tail sample to the sequence length; instead every step here
takes **one bucket** and as many samples of it as fit the step's **token budget**, so a step
of short samples costs about as much as a step of long ones and padding is only the waste
inside one bucket.

The drawn samples are dealt to the data-parallel ranks and their micro-batches so that every
rank's cost is as equal as possible (training/data/dealing.py says why and how).

Determinism: everything a step draws is a pure function of ``(seed, state)``. The state
(:meth:`DynamicBatchSampler.state_dict`) is plain JSON — the step count, the tokens consumed
(ramp-up) and, per (language, bucket) stream, its epoch and position in the epoch's seeded
permutation — so it goes into a checkpoint and a resumed run draws exactly what an
uninterrupted run would have drawn. The permutations are computed, not stored
(:func:`permutation_at`), so the sampler's memory does not grow with the data.

The data it draws from is ``training.data.shard_reader.ShardIndex``; a ``StepPlan``
(training/data/dealing.py) is what it hands the trainer per step.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Optional

import numpy as np

from bloomline.errors import ConfigError, DataError
from training.config import BatchConfig
from training.data.dealing import StepPlan, balance, build_plan, split_micro_batches
from training.data.shard_reader import SampleRef, ShardIndex, Stream
from training.planning.flops import sample_cost

STATE_VERSION = 2  # 2: permutations by permutation_at (1 drew numpy permutations)


def seed_words(seed: int) -> int:
    # numpy's SeedSequence wants non-negative entropy; accept any int seed.
    return int(seed) & (2**64 - 1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele et al., "Fast splittable pseudorandom number generators",
    2014): a bijective avalanche of uint64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def permutation_at(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """Elements ``positions`` of a keyed pseudo-random permutation of ``range(n)``, computed
    without a table (a table of a 180M-sample stream would be 1.4 GB on every rank).

    A 4-round balanced Feistel network on the smallest even bit width ``b`` with 2^b ≥ n is a
    bijection of [0, 2^b); cycle walking — applying it again while the result is ≥ n — restricts
    it to a bijection of [0, n) (Black & Rogaway, "Ciphers with Arbitrary Finite Domains", 2002).
    2^b < 4n, so fewer than 4 walks are expected."""
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    half, mask = np.uint64(bits // 2), np.uint64(2 ** (bits // 2) - 1)
    keys = _mix(np.array([(key * 4 + r) & (2**64 - 1) for r in range(4)], dtype=np.uint64))

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << half) | right

    out = feistel(np.asarray(positions, dtype=np.uint64))
    walk = out >= n
    while walk.any():
        out[walk] = feistel(out[walk])
        walk = out >= n
    return out.astype(np.int64)


def take_epochs(
    size: int, epoch: int, pos: int, count: int, perm: Callable[[int, np.ndarray], np.ndarray]
) -> tuple[np.ndarray, int, int]:
    """The next ``count`` indices of a sequence read in permutation order, epoch after epoch
    (``perm(epoch, positions)``: the epoch's permutation at those positions).

    Returns ``(indices, epoch, pos)`` after the read; a new epoch (a new permutation) begins
    when the current one is exhausted, so a small stream may repeat within one read.
    """
    out = []
    while count > 0:
        if pos == size:
            epoch, pos = epoch + 1, 0
        k = min(count, size - pos)
        out.append(perm(epoch, np.arange(pos, pos + k)))
        pos, count = pos + k, count - k
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), epoch, pos


def ramped_budget(tokens_per_step: int, rampup: Optional[tuple[int, int, float]], consumed: int) -> int:
    """A step's token budget after ``consumed`` tokens (BLOOM's ramp-up; ``rampup`` as
    :meth:`DynamicBatchSampler._rampup_schedule` gives it, None: no ramp-up)."""
    if rampup is None:
        return tokens_per_step
    start, inc, portion = rampup
    return min(tokens_per_step, start + inc * int(consumed // portion))


def planned_tokens(batch: BatchConfig, steps: int) -> int:
    """The budgets of ``steps`` steps summed, ramp-up included, as if every step trained its whole
    budget: an upper bound on the tokens the run trains (padding is not trained, and it slows the
    ramp-up, which counts real tokens)."""
    rampup = DynamicBatchSampler._rampup_schedule(batch)
    consumed = 0
    for done in range(steps):
        if rampup is None or consumed >= batch.rampup_tokens:  # the full budget from here on
            return consumed + (steps - done) * batch.tokens_per_step
        consumed += ramped_budget(batch.tokens_per_step, rampup, consumed)
    return consumed


class DynamicBatchSampler:
    """One bucket per step, a token budget per step, load-balanced over data-parallel ranks.

    Per step (all of it a pure function of ``(seed, state)``):

    1. **Budget** ``B``: ``batch.tokens_per_step``, or during ramp-up (BLOOM's batch-size
       ramp-up, in tokens) ``min(tokens_per_step, start + increment·⌊consumed / portion⌋)``
       where ``portion = rampup_tokens / ⌈(tokens_per_step − start) / increment⌉`` and
       ``consumed`` counts the real tokens of all earlier steps.
    2. **Shape** for each bucket ``b``: ``m_b = max(1, micro_batch_tokens // b)`` samples per
       micro-batch and ``gas_b = max(1, round(B / (dp·m_b·b)))`` micro-batches per rank, so a
       step draws ``N_b = dp·gas_b·m_b`` samples, ``N_b·b ≈ B`` padded tokens.
    3. **Bucket**: the blend gives bucket ``b`` the token share
       ``s_b = Σ_lang w_lang · tokens(lang, b) / tokens(lang)``. A step of bucket ``b`` yields
       ``N_b · (mean length in b)`` tokens, which differs between buckets (padding, rounding of
       gas), so ``b`` is drawn with probability ∝ ``Σ_lang w_lang·rows(lang,b)/tokens(lang) /
       N_b`` — this makes the *expected tokens trained* from ``b`` exactly ∝ ``s_b`` (it equals
       ``s_b / (tokens per step)`` when every step yields the same tokens).
    4. **Languages**: each of the ``N_b`` samples is of language ``lang`` with probability ∝
       ``w_lang · rows(lang, b) / tokens(lang)`` (a multinomial draw). With 3. this gives every
       language exactly its blend share of real tokens in expectation, and every (lang, bucket)
       stream of a language advances through its epochs at the same rate.
    5. **Samples**: each (lang, bucket) stream is read in a seeded permutation per epoch
       (``(seed, stream, epoch)``); when exhausted, the next epoch's permutation begins.
    6. **Balance** (training/data/dealing.py ``balance``) and split into micro-batches
       (``split_micro_batches``).
    """

    def __init__(
        self,
        index: ShardIndex,
        batch: BatchConfig,
        dp_size: int,
        seq_len: int,
        seed: int,
        blend: Optional[dict[str, float]] = None,
        pair_weight: Optional[float] = None,
        dealing: str = "balanced",
    ):
        """``pair_weight``: the cost of one attended pair in padded positions (training.planning.flops.model_pair_weight
        of the model); ``batch.attn_weight`` overrides it, and without either it is 2/seq_len (a full
        sample's attention costs as much as its linear part). ``dealing="round_robin"`` deals the
        drawn samples by position (sample i to rank i mod dp) instead, the baseline of bench/balance.py."""
        if dp_size < 1:
            raise ConfigError("parallel.dp", "must be >= 1")
        if dealing not in ("balanced", "round_robin"):
            raise ValueError(f"dealing must be balanced or round_robin, not {dealing!r}")
        self.index, self.batch, self.dp, self.seq_len, self.seed = index, batch, int(dp_size), int(seq_len), int(seed)
        self.dealing = dealing
        self.pair_weight = (
            batch.attn_weight
            if batch.attn_weight is not None
            else pair_weight
            if pair_weight is not None
            else 2.0 / self.seq_len
        )
        self.weights = self._resolve_blend(index.manifest["blend"] if blend is None else blend)
        self.streams = [s for s in index.streams.values() if self.weights.get(s.lang, 0.0) > 0 and s.size]
        self._lang_tokens = {lg: index.lang_tokens(lg) for lg in self.weights}
        self._by_bucket = self._draw_weights()
        self._rampup = self._rampup_schedule(batch)
        self.step = 0
        self.consumed_tokens = 0
        self.tokens_by_lang: dict[str, int] = {}  # real tokens drawn per language so far (evaluation reads it)
        self.positions: dict[str, list[int]] = {s.key: [0, 0] for s in self.streams}  # key -> [epoch, pos]

    def _draw_weights(self) -> dict[int, tuple[list[Stream], np.ndarray]]:
        """Per bucket: its streams and their draw weights ``w_lang·rows/tokens(lang)`` (step 4)."""
        grouped: dict[int, list[Stream]] = {}
        for s in self.streams:
            grouped.setdefault(s.bucket, []).append(s)
        return {
            b: (ss, np.array([self.weights[s.lang] * s.size / self._lang_tokens[s.lang] for s in ss]))
            for b, ss in sorted(grouped.items())
        }

    def set_weights(self, weights: dict[str, float]) -> None:
        """Draw the next steps from ``weights`` (the online mixture, training/data/mixture/controller.py), over the
        same languages as the starting blend. Every (language, bucket) stream keeps its epoch and
        position: a language drawn less is read more slowly, one drawn more reads on, and no
        sample is skipped or drawn twice by the change itself (NVIDIA/Megatron-LM#457: a blend
        index rebuilt from new weights loses and repeats samples)."""
        if set(weights) != set(self.weights):
            raise ValueError(f"new weights over {sorted(weights)}, the blend is over {sorted(self.weights)}")
        total = float(sum(weights.values()))
        self.weights = {k: float(weights[k]) / total for k in sorted(weights)}
        self._by_bucket = self._draw_weights()

    def _resolve_blend(self, blend: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in blend.items() if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v))}
        if bad:
            raise ConfigError("blend", f"weights must be finite and >= 0, got {bad}")
        has_data = {lg for lg in self.index.languages if self.index.lang_tokens(lg)}
        missing = sorted(k for k, v in blend.items() if v > 0 and k not in has_data)
        if missing:
            raise DataError(
                f"the blend names {missing}, which have no '{self.index.split}' data in {self.index.data_dir}"
            )
        total = float(sum(blend.values()))
        if total <= 0:
            raise ConfigError("blend", "gives no weight to any language")
        return {k: v / total for k, v in sorted(blend.items()) if v > 0}

    @staticmethod
    def _rampup_schedule(batch: BatchConfig) -> Optional[tuple[int, int, float]]:
        start = batch.rampup_start_tokens
        if start is None or batch.rampup_tokens <= 0 or start >= batch.tokens_per_step:
            return None
        increments = math.ceil((batch.tokens_per_step - start) / batch.rampup_increment_tokens)
        return start, batch.rampup_increment_tokens, batch.rampup_tokens / increments

    def budget(self) -> int:
        """Token budget of the next step (ramp-up applied)."""
        return ramped_budget(self.batch.tokens_per_step, self._rampup, self.consumed_tokens)

    def epochs(self) -> dict[str, float]:
        """Passes over each language's training tokens so far: its tokens drawn ÷ its tokens."""
        return {lg: self.tokens_by_lang.get(lg, 0) / n for lg, n in sorted(self._lang_tokens.items()) if n}

    def shape(self, bucket: int, budget: int) -> tuple[int, int]:
        """``(m_b, gas)`` of a step of ``bucket`` under ``budget``."""
        m = max(1, self.batch.micro_batch_tokens // bucket)
        gas = max(1, int(math.floor(budget / (self.dp * m * bucket) + 0.5)))
        return m, gas

    def _key(self, stream: Stream, epoch: int) -> int:
        words = [seed_words(self.seed), 1, zlib.crc32(stream.key.encode()), epoch]
        return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])

    def _take(self, stream: Stream, count: int) -> np.ndarray:
        """The next ``count`` sample indices of a stream, starting new epochs as needed."""
        epoch, pos = self.positions[stream.key]
        idx, epoch, pos = take_epochs(
            stream.size, epoch, pos, count, lambda e, at: permutation_at(at, stream.size, self._key(stream, e))
        )
        self.positions[stream.key] = [epoch, pos]
        return idx

    def next_step(self) -> StepPlan:
        budget = self.budget()
        rng = np.random.default_rng([seed_words(self.seed), 0, self.step + 1])
        buckets = list(self._by_bucket)
        shapes = [self.shape(b, budget) for b in buckets]
        p = np.array([w.sum() / (self.dp * gas * m) for (_, w), (m, gas) in zip(self._by_bucket.values(), shapes)])
        k = int(rng.choice(len(buckets), p=p / p.sum()))
        bucket, (m, gas) = buckets[k], shapes[k]
        streams, w = self._by_bucket[bucket]
        counts = rng.multinomial(self.dp * gas * m, w / w.sum())
        refs: list[SampleRef] = []
        lengths, pairs, langs = [], [], []
        for s, c in zip(streams, counts):
            sids, rows = s.locate(self._take(s, int(c)))
            refs.extend(zip(sids.tolist(), rows.tolist()))
            lengths.append(self.index.lengths(sids, rows))
            pairs.append(self.index.pairs(sids, rows))
            langs.extend([s.lang] * len(rows))
        lengths = np.concatenate(lengths)
        cost = sample_cost(np.full(len(lengths), bucket), np.concatenate(pairs), self.pair_weight)
        if self.dealing == "balanced":
            members = balance(cost, self.dp, gas * m, self.batch.balance_tolerance)
        else:
            members = [list(range(r, len(cost), self.dp)) for r in range(self.dp)]
        assignment = [split_micro_batches(mem, cost, gas) for mem in members]
        self.step += 1
        tokens = int(lengths.sum())
        self.consumed_tokens += tokens
        plan = build_plan(
            self.step,
            refs,
            lengths,
            langs,
            assignment,
            [[bucket] * gas for _ in range(self.dp)],
            cost,
            self._lr_scale(tokens),
            budget,
        )
        for lang, n in plan.lang_tokens.items():
            self.tokens_by_lang[lang] = self.tokens_by_lang.get(lang, 0) + n
        return plan

    def _lr_scale(self, tokens: int) -> float:
        ratio = tokens / self.batch.tokens_per_step
        return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.batch.lr_scaling]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state after the last step (goes into a checkpoint)."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "step": self.step,
            "consumed_tokens": self.consumed_tokens,
            "tokens_by_lang": dict(sorted(self.tokens_by_lang.items())),
            "streams": {s.key: [*self.positions[s.key], s.size] for s in self.streams},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next step is ``state['step'] + 1``, drawn as an uninterrupted run would.

        Refuses a state from another seed or from other data (a stream's row count differs),
        since either would silently draw other samples than the checkpointed run.
        """
        if state.get("version") != STATE_VERSION:
            raise DataError(f"sampler state version {state.get('version')}, this bloomline reads {STATE_VERSION}")
        if state["seed"] != self.seed:
            raise ConfigError(
                "train.seed",
                f"the checkpoint's sampler was seeded with {state['seed']}, this run with "
                f"{self.seed}; resume with the same seed",
            )
        sizes = {s.key: s.size for s in self.streams}
        for key, (_, _, rows) in state["streams"].items():
            if key in sizes and sizes[key] != rows:
                raise DataError(
                    f"sampler state: stream {key} had {rows} rows, the data now has {sizes[key]}: the data "
                    "changed since the checkpoint"
                )
        self.step, self.consumed_tokens = int(state["step"]), int(state["consumed_tokens"])
        self.tokens_by_lang = {k: int(v) for k, v in state["tokens_by_lang"].items()}
        self.positions = {key: [int(v) for v in state["streams"].get(key, [0, 0])[:2]] for key in sizes}
