"""The language mixture while training runs: fixed, or steered online by per-language signals.

``batch.mixture: fixed`` (the default) samples every step from the starting blend (the manifest's
α-smoothed weights, or the recipe's). ``batch.mixture: online`` lets a :class:`MixtureController`
move the weights at step boundaries, by one of two rules (``batch.online.rule``):

* ``bandit``: exponential weights over each language's smoothed *training* loss, the rule of
  Online Data Mixing (Albalak et al. 2023, "Efficient Online Data Mixing for Language Model
  Pre-Training", arXiv 2312.02406: EXP3 with a smoothed loss reward and a decaying exploration
  rate ε_t = min(1/K, sqrt(ln K / (K·t)))). One difference, on purpose: EXP3 divides a reward by
  the probability of the arm played because a bandit sees the loss of one arm per round; a step
  here draws samples of (nearly) every language and the trainer measures the loss of each, so
  the plain loss is already an unbiased reward (the full-information case, Hedge), and dividing
  by a weight of 0.002 would make the smallest language's reward 500× its loss.
* ``evaluation``: the held-out bits per byte of each checkpoint's automatic evaluation, as each
  checkpoint's results land (``batch.online.signal: continuation``: the error rate on the
  ``continuation`` task instead, a downstream measure; progress below alike). With a reference run (``batch.online.reference``), DoReMi's excess
  loss (Xie et al. 2023, "DoReMi", arXiv 2305.10429, Algorithm 1): how far each language's bpb is
  above the reference's at the same tokens of that language seen, clipped at 0, drives an
  exponentiated-gradient step. Without one, each language's own *learning progress*: the drop
  of its bpb per doubling of its tokens seen since the previous checkpoint (progress as a
  curriculum signal: Graves et al. 2017, "Automated Curriculum Learning for Neural Networks").
  Why progress and not the bpb level: levels differ between languages by their nature (a
  script's bytes per character, code's regularity), so steering by level would pour data into
  the intrinsically hardest languages; a language whose bpb still falls fast is still being
  taught by its data, one that has flattened is saturated. bpb does not depend on the
  tokenizer, so a reference may come from a run with the same data and another model.

Safety, for every rule: the target weights are mixed into the current ones (``smoothing``), and
each language's weight stays within ``[min_weight, max_weight]`` (the collapse to one language
that DoReMi's users met, sangmichaelxie/doremi#5, cannot happen). Weights change only between
steps, and every rank computes them from the same inputs (all-reduced losses, the same results
file), so they agree without a broadcast.

This module is plain arithmetic on numpy arrays; the trainer feeds it and the sampler applies
its weights (training/data/sampler.py keeps every (language, bucket) stream's position, so a change
of weights neither skips nor repeats a sample: NVIDIA/Megatron-LM#457 is what it avoids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from bloomline.errors import ConfigError
from training.config import OnlineMixtureConfig

STATE_VERSION = 1


def bound(w: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The weights ``c·w`` clipped to ``[lo, hi]`` that sum to 1 (``c`` found by bisection):
    languages at a floor or a ceiling are pinned there, the others keep their ratios. Needs
    ``len(w)·lo ≤ 1 ≤ len(w)·hi`` and ``w > 0``."""
    w = np.asarray(w, dtype=np.float64)

    def total(c: float) -> float:
        return float(np.clip(c * w, lo, hi).sum())

    a, b = 0.0, 1.0 / float(w.min())  # total(0) = n·lo ≤ 1; total grows to n·hi ≥ 1 with c
    for _ in range(64):
        if total(b) >= 1:
            break
        b *= 2
    for _ in range(200):  # deterministic: the same inputs give the same bits on every rank
        m = (a + b) / 2
        if total(m) < 1:
            a = m
        else:
            b = m
    out = np.clip(b * w, lo, hi)
    return out / out.sum()


def exploration(t: int, k: int) -> float:
    """EXP3's exploration rate after ``t`` updates over ``k`` arms (ODM): min(1/k, sqrt(ln k / (k·t)))."""
    if k < 2:
        return 0.0
    return min(1.0 / k, math.sqrt(math.log(k) / (k * max(t, 1))))


def bandit_target(prior: np.ndarray, reward: np.ndarray, eta: float, eps: float) -> np.ndarray:
    """Exponential weights from the starting blend: ``(1 − k·ε)·softmax(log prior + η·reward) + ε``.
    Starting from the prior (not uniform) keeps a language's share tied to its data until its
    loss says otherwise; the mean reward is subtracted for numerical range only (softmax is
    shift-invariant)."""
    z = np.log(prior) + eta * (reward - reward.mean())
    p = np.exp(z - z.max())
    p /= p.sum()
    k = len(prior)
    return (1 - k * eps) * p + eps


def excess_target(weights: np.ndarray, signal: np.ndarray, eta: float) -> np.ndarray:
    """DoReMi's exponentiated-gradient step: ``softmax(log w + η·signal)``."""
    z = np.log(weights) + eta * signal
    p = np.exp(z - z.max())
    return p / p.sum()


def progress(bpb_before: np.ndarray, bpb_now: np.ndarray, seen_before: np.ndarray, seen_now: np.ndarray) -> np.ndarray:
    """Each language's learning progress between two checkpoints: the drop of its measure (bpb,
    or an error rate) per doubling of its tokens seen (0 where it saw no new tokens; NaN where
    either checkpoint has no measure of it)."""
    doublings = np.log2(np.maximum(seen_now, 1) / np.maximum(seen_before, 1))
    out = np.zeros_like(bpb_now, dtype=np.float64)
    out[~(np.isfinite(bpb_before) & np.isfinite(bpb_now))] = np.nan
    moved = (doublings > 0) & np.isfinite(out)
    out[moved] = (bpb_before[moved] - bpb_now[moved]) / doublings[moved]
    return out


@dataclass
class ReferenceCurve:
    """A reference run's per-language bpb against that language's tokens seen, one checkpoint
    per point (DoReMi's reference model, read from another run's results)."""

    run: str
    points: dict[str, list[tuple[int, float]]]
    """lang → [(tokens_seen, bpb)] in tokens_seen order."""

    def at(self, lang: str, tokens: int) -> float:
        """The reference's bpb at ``tokens`` of ``lang`` seen: linear in log tokens between its
        checkpoints, its first or last value outside them."""
        pts = self.points[lang]
        xs = np.log(np.maximum([p[0] for p in pts], 1))
        return float(np.interp(math.log(max(tokens, 1)), xs, [p[1] for p in pts]))


@dataclass
class Change:
    """One decision: the step after which it applies, the new weights (None: results taken in,
    weights unchanged), and its cause."""

    step: int
    weights: Optional[dict[str, float]]
    cause: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "weights": self.weights, "cause": self.cause}


@dataclass
class MixtureController:
    """Holds the current weights and the state of the rule; every rank runs one, fed the same
    inputs, so every rank holds the same weights.

    ``languages`` fixes the order of every vector; ``prior`` is the starting blend."""

    cfg: OnlineMixtureConfig
    languages: list[str]
    prior: np.ndarray
    reference: Optional[ReferenceCurve] = None
    weights: np.ndarray = field(init=False)
    reward: np.ndarray = field(init=False)  # smoothed loss per language (NaN: not measured yet)
    updates: int = 0
    window_loss: np.ndarray = field(init=False)  # Σ token loss per language since the last bandit update
    window_tokens: np.ndarray = field(init=False)
    last_eval: Optional[dict[str, Any]] = None  # the results last applied: {"checkpoint", "bpb", "seen"}
    # ("bpb": the signal's measure per language, the continuation error rate with that signal; None: not measured)

    def __post_init__(self) -> None:
        k = len(self.languages)
        self.cfg.check_languages(k)
        self.prior = np.asarray(self.prior, dtype=np.float64)
        self.weights = bound(self.prior, self.cfg.min_weight, self.cfg.max_weight)
        self.reward = np.full(k, np.nan)
        self.window_loss = np.zeros(k)
        self.window_tokens = np.zeros(k)

    def blend(self) -> dict[str, float]:
        return {lang: float(w) for lang, w in zip(self.languages, self.weights)}

    def _move(self, step: int, target: np.ndarray, cause: dict[str, Any]) -> Change:
        mixed = (1 - self.cfg.smoothing) * self.weights + self.cfg.smoothing * target
        self.weights = bound(mixed, self.cfg.min_weight, self.cfg.max_weight)
        self.updates += 1
        return Change(step, self.blend(), cause)

    # ------------------------------------------------------------------------- bandit
    def observe_losses(self, step: int, loss_sum: Sequence[float], tokens: Sequence[float]) -> Optional[Change]:
        """Feed step ``step``'s per-language Σ token loss and labelled tokens (all ranks, in
        ``languages`` order); returns the change the bandit makes after this step, if any."""
        self.window_loss += np.asarray(loss_sum, dtype=np.float64)
        self.window_tokens += np.asarray(tokens, dtype=np.float64)
        if self.cfg.rule != "bandit" or step % self.cfg.every or step < self.cfg.warmup_steps:
            return None
        seen = self.window_tokens > 0
        mean = np.divide(self.window_loss, self.window_tokens, out=np.zeros_like(self.window_loss), where=seen)
        a = self.cfg.loss_smoothing
        first = seen & np.isnan(self.reward)
        self.reward[first] = mean[first]
        again = seen & ~first
        self.reward[again] = a * self.reward[again] + (1 - a) * mean[again]
        window = (int(self.window_tokens.sum()), int(seen.sum()))
        self.window_loss[:], self.window_tokens[:] = 0, 0
        if np.isnan(self.reward).all():
            return None
        # A language not measured yet (small steps draw a few languages each) counts as average:
        # neither favoured nor starved until its own loss is known.
        reward = np.where(np.isnan(self.reward), np.nanmean(self.reward), self.reward)
        eps = exploration(self.updates + 1, len(self.languages)) if self.cfg.explore else 0.0
        target = bandit_target(self.prior, reward, self.cfg.eta, eps)
        return self._move(
            step,
            target,
            {
                "rule": "bandit",
                "signal": "training loss",
                "tokens": window[0],
                "exploration": eps,
                "reward": {
                    l: (None if math.isnan(r) else round(float(r), 6)) for l, r in zip(self.languages, self.reward)
                },
            },
        )

    # ----------------------------------------------------------------------- evaluation
    def observe_results(
        self, step: int, checkpoint: int, bpb: dict[str, float], seen: dict[str, int]
    ) -> Optional[Change]:
        """Feed the evaluation of checkpoint ``checkpoint`` (per language the signal's measure,
        lower is better: bpb, or the continuation error rate; and tokens seen); returns the
        change made after step ``step``, if any. Results of a checkpoint not newer than the last
        applied one are ignored. The continuation signal may lack a language (NaN or absent:
        the task skipped it), which then gets no push; bpb may not."""
        if self.cfg.rule != "evaluation" or step < self.cfg.warmup_steps:
            return None
        if self.last_eval is not None and checkpoint <= self.last_eval["checkpoint"]:
            return None
        previous = self.last_eval
        now, tokens = self._take_eval(checkpoint, bpb, seen)
        if self.reference is None and previous is None:  # progress needs two evaluations: taken in, no change yet
            return Change(
                step,
                None,
                {
                    "rule": "evaluation",
                    "checkpoint": checkpoint,
                    "signal": f"{self._measure()} progress per doubling of tokens seen",
                    "held": "the first evaluation: progress needs a second",
                },
            )
        signal, cause = self._eval_signal(previous, now, tokens)
        target = excess_target(self.weights, signal, self.cfg.eta)
        return self._move(
            step,
            target,
            {
                "rule": "evaluation",
                "checkpoint": checkpoint,
                **cause,
                "value": {l: round(float(v), 6) for l, v in zip(self.languages, signal)},
            },
        )

    def _take_eval(self, checkpoint: int, bpb: dict[str, float], seen: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """The evaluation's measures and tokens seen in ``languages`` order (NaN: not measured),
        kept as ``last_eval``. ConfigError if bpb lacks a language."""
        missing = [l for l in self.languages if l not in bpb]
        if missing and self.cfg.signal == "bpb":
            raise ConfigError(
                "batch.online.rule", f"the evaluation of checkpoint {checkpoint} has no bpb for {missing}"
            )
        now = np.array([bpb.get(l, math.nan) for l in self.languages], dtype=np.float64)
        tokens = np.array([seen.get(l, 0) for l in self.languages], dtype=np.float64)
        self.last_eval = {
            "checkpoint": checkpoint,
            "bpb": [None if math.isnan(v) else v for v in now.tolist()],
            "seen": tokens.tolist(),
        }
        return now, tokens

    def _eval_signal(
        self, previous: Optional[dict[str, Any]], now: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Each language's push (higher: drawn more) and its cause: the excess over the reference
        run's measure at the same tokens seen, or else the progress since ``previous`` (the last
        evaluation, not None then). An unmeasured language gets the measured ones' mean."""
        if self.reference is not None:
            ref = np.array([self.reference.at(l, int(t)) for l, t in zip(self.languages, tokens)])
            signal = np.maximum(now - ref, 0.0)
            cause: dict[str, Any] = {"signal": f"excess bpb over {self.reference.run}"}
        else:
            assert previous is not None
            before = np.array([math.nan if v is None else v for v in previous["bpb"]], dtype=np.float64)
            signal = progress(before, now, np.array(previous["seen"]), tokens)
            cause = {
                "signal": f"{self._measure()} progress per doubling of tokens seen",
                "since": previous["checkpoint"],
            }
        unmeasured = np.isnan(signal)
        if unmeasured.any():  # no measure, no push: the measured languages' mean (a softmax step
            # moves a language by its signal's distance from the others', so 0 would starve it)
            cause["unmeasured"] = [l for l, u in zip(self.languages, unmeasured) if u]
            signal = np.where(unmeasured, signal[~unmeasured].mean() if (~unmeasured).any() else 0.0, signal)
        return signal, cause

    def _measure(self) -> str:
        return "bpb" if self.cfg.signal == "bpb" else "continuation error"

    # ---------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: the weights and the rule's state (contract 2's ``mixture``)."""

        def floats(a: np.ndarray) -> list[Optional[float]]:
            return [None if math.isnan(x) else float(x) for x in a]

        return {
            "version": STATE_VERSION,
            "rule": self.cfg.rule,
            "signal": self.cfg.signal,
            "languages": list(self.languages),
            "weights": floats(self.weights),
            "reward": floats(self.reward),
            "updates": self.updates,
            "window_loss": floats(self.window_loss),
            "window_tokens": floats(self.window_tokens),
            "last_eval": self.last_eval,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                "batch.online", f"mixture state version {state.get('version')}, this bloomline reads {STATE_VERSION}"
            )
        if state["languages"] != list(self.languages):
            raise ConfigError(
                "batch.online",
                f"the checkpoint's mixture is over {state['languages']}, this run's over {self.languages}",
            )
        if state["rule"] != self.cfg.rule:
            raise ConfigError(
                "batch.online.rule", f"the checkpoint's mixture was steered by {state['rule']!r}; resume with that rule"
            )
        if state.get("signal", "bpb") != self.cfg.signal:  # states written before the signal was a choice: bpb
            raise ConfigError(
                "batch.online.signal",
                f"the checkpoint's mixture was steered by {state.get('signal', 'bpb')!r}; resume with that signal",
            )

        def arr(xs: list[Optional[float]]) -> np.ndarray:
            return np.array([np.nan if x is None else x for x in xs], dtype=np.float64)

        self.weights, self.reward = arr(state["weights"]), arr(state["reward"])
        self.window_loss, self.window_tokens = arr(state["window_loss"]), arr(state["window_tokens"])
        self.updates, self.last_eval = int(state["updates"]), state["last_eval"]
