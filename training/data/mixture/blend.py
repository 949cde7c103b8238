"""The language blend a run draws from (``batch.blend``, training/config/batch.py): the weights
of its rule, worked out from each language's training tokens in the data's manifest, and for a
schedule the weights of every step.

* ``alpha``: p ∝ tokens^α, BLOOM's α-sampling (α = 0.3 lifts the tail of ROOTS, where English
  has ~30% of the bytes and Chi Tumbuka 2·10⁻⁷); with no α, the manifest's blend as prepared.
* ``natural``: p ∝ tokens (α = 1).
* ``weights``: the recipe's, normalised over the languages with data.
* ``unimax``: UniMax (Chung et al. 2023, "UniMax: Fairer and More Effective Language Sampling for
  Large-Scale Multilingual Pretraining", arXiv 2304.09151, Algorithm 1). Languages in ascending
  order of tokens; each takes an equal share of the budget still unassigned, ``left / languages
  left``, but at most ``max_epochs`` passes over its own tokens; what a capped language does not
  take stays in the pool for the larger ones after it. p ∝ each language's share.
* ``schedule``: temperature sampling p ∝ tokens^(1/τ) with τ moving linearly, step by step,
  from ``temperature_start`` (step 1) to ``temperature_end`` (step ``schedule_steps``, and after):
  the "Cooldown" of Li et al. 2025 ("Upsample or Upweight? Balanced Training on Heavily
  Imbalanced Datasets", NAACL 2025, arXiv 2410.04579): upsample the tail hard early, when it
  speeds convergence, and less later, when repeating it would overfit.

Every rule is a function of the data and the recipe alone (a schedule's also of the step), so a
resumed run draws from the weights an uninterrupted one would: nothing of it is checkpointed
beyond its description, which a resume compares.

The budget UniMax spreads is the run's planned tokens (training/data/sampler.py ``planned_tokens``:
every step's budget, ramp-up included). A step trains its budget less its padding, so a language
capped at N epochs of the budget sees at most N epochs of real tokens, in expectation (the
sampler draws languages at random with these weights).
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from bloomline import languages
from bloomline.errors import ConfigError, DataError
from data_prep.passes.alpha import alpha_weights
from training.config import BlendRuleConfig, TrainRecipe
from training.config.batch import MANIFEST_BLEND
from training.data.sampler import planned_tokens
from training.data.shard_reader import ShardIndex

KEY = "batch.blend"


def unimax_budgets(tokens: dict[str, int], budget: float, max_epochs: float) -> dict[str, float]:
    """UniMax's tokens per language (Algorithm 1, module docstring); refuses a cap the data cannot meet."""
    order = sorted((lang for lang in tokens if tokens[lang] > 0), key=lambda lang: (tokens[lang], lang))
    left, out = float(budget), {}
    for i, lang in enumerate(order):
        out[lang] = min(left / (len(order) - i), max_epochs * tokens[lang])
        left -= out[lang]
    if left > 1e-9 * budget:
        total = sum(tokens[lang] for lang in order)
        raise ConfigError(
            f"{KEY}.max_epochs",
            f"{max_epochs:g} epochs of every language hold {max_epochs * total:,.0f} tokens, less than the "
            f"run's budget of {budget:,.0f} (train.steps × batch.tokens_per_step): raise it to at least "
            f"{budget / total:.3g} or train fewer steps",
        )
    return out


def stage_of(cfg: BlendRuleConfig, step: int, steps: int) -> tuple[int, int]:
    """(stage of step ``step``, the last stage): τ moves ``m = min(schedule_moves, schedule_steps
    − 1)`` times, in ``m + 1`` stages of ⌈schedule_steps / (m + 1)⌉ steps, the last one lasting
    to the end of the run."""
    n = cfg.schedule_steps or steps
    moves = min(cfg.schedule_moves, n - 1)
    every = math.ceil(n / (moves + 1))
    return min((max(1, step) - 1) // every, moves), moves


def temperature_at(cfg: BlendRuleConfig, step: int, steps: int) -> float:
    """The schedule's τ for step ``step`` (1-based) of a run of ``steps``: ``temperature_start`` in
    the first stage, ``temperature_end`` in the last, evenly between them in the others."""
    k, moves = stage_of(cfg, step, steps)
    if moves == 0:
        return cfg.temperature_end
    return cfg.temperature_start + (cfg.temperature_end - cfg.temperature_start) * k / moves


class Blend:
    """``batch.blend``'s rule resolved against one run's data: the weights each step draws from.

    ``tokens``: each language's training tokens (the sampler's index); ``manifest_blend``: the
    data's blend (the ``alpha`` rule without an α); ``budget``: the run's planned tokens
    (``unimax``); ``steps``: ``train.steps`` (``schedule``)."""

    def __init__(
        self,
        cfg: BlendRuleConfig,
        tokens: dict[str, int],
        manifest_blend: dict[str, float],
        budget: int,
        steps: int,
    ):
        self.cfg, self.steps = cfg, int(steps)
        self.tokens = {k: int(v) for k, v in sorted(tokens.items()) if v > 0}
        self.budgets: Optional[dict[str, float]] = None
        """``unimax``: the tokens the rule gives each language (its epochs cap applied)."""
        if cfg.rule == "alpha":
            self._fixed = dict(manifest_blend) if cfg.alpha is None else alpha_weights(self.tokens, cfg.alpha)
        elif cfg.rule == "natural":
            self._fixed = alpha_weights(self.tokens, 1.0)
        elif cfg.rule == "weights":
            self._fixed = self._named_weights(cfg.weights)
        elif cfg.rule == "unimax":
            assert cfg.max_epochs is not None  # validate() requires it
            self.budgets = unimax_budgets(self.tokens, budget, cfg.max_epochs)
            total = sum(self.budgets.values())
            self._fixed = {k: v / total for k, v in self.budgets.items()}
        else:
            self._fixed = None

    def _named_weights(self, weights: dict[str, float]) -> dict[str, float]:
        w: dict[str, float] = {}
        for name, v in weights.items():
            # a language code or alias, or the code as the data names it
            code = languages.resolve(name) or (name if name in self.tokens else None)
            if code is None:
                raise ConfigError(f"{KEY}.weights.{name}", f"not one of {languages.KNOWN}")
            w[code] = float(v)
        missing = sorted(k for k, v in w.items() if v > 0 and k not in self.tokens)
        if missing:
            raise DataError(f"{KEY}.weights names {missing}, which have no training data")
        if sum(w.get(k, 0.0) for k in self.tokens) <= 0:
            raise ConfigError(f"{KEY}.weights", "gives no weight to any language with training data")
        return {k: w.get(k, 0.0) for k in self.tokens}

    @property
    def moves(self) -> bool:
        """Whether the weights change with the step (a schedule)."""
        return self._fixed is None

    def moves_at(self, step: int) -> bool:
        """Whether step ``step`` (1-based) draws from other weights than the step before it."""
        t = lambda s: temperature_at(self.cfg, s, self.steps)  # noqa: E731
        return self.moves and step > 1 and t(step) != t(step - 1)

    def weights_for(self, step: int) -> dict[str, float]:
        """The weights step ``step`` (1-based) draws from, normalised."""
        if self._fixed is not None:
            w = self._fixed
        else:
            w = alpha_weights(self.tokens, 1.0 / temperature_at(self.cfg, step, self.steps))
        total = sum(w.values())
        return {k: v / total for k, v in sorted(w.items())}

    def describe(self, step: int = 1) -> dict[str, Any]:
        """The rule and what it was resolved with, for ``mixture.jsonl``'s records and a resume's check."""
        c = self.cfg
        out: dict[str, Any] = {"rule": c.rule}
        if c.rule == "alpha":
            out["alpha"] = c.alpha if c.alpha is not None else MANIFEST_BLEND["alpha"]
        elif c.rule == "weights":
            out["weights"] = {k: float(v) for k, v in sorted(c.weights.items())}
        elif c.rule == "unimax":
            out["max_epochs"] = c.max_epochs
            out["budget"] = round(sum(self.budgets.values())) if self.budgets else 0
        elif c.rule == "schedule":
            out.update(
                temperature_start=c.temperature_start,
                temperature_end=c.temperature_end,
                schedule_steps=c.schedule_steps or self.steps,
                schedule_moves=c.schedule_moves,
                temperature=round(temperature_at(c, step, self.steps), 6),
            )
        return out

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpointed one for its weights to be the same."""
        d = self.describe()
        d.pop("temperature", None)
        return d


def check_resume(saved: dict[str, Any], blend: Blend, step: int) -> None:
    """Refuse to resume a checkpoint trained under another blend rule: the run would draw other data
    from the step it resumes at, and its record would not say so."""
    now = blend.identity()
    if saved != now:
        raise ConfigError(
            KEY,
            f"the checkpoint at step {step} was trained with {json.dumps(saved, sort_keys=True)}, this run "
            f"asks for {json.dumps(now, sort_keys=True)}; resume it with the same rule",
        )


def run_blend(recipe: TrainRecipe, index: ShardIndex) -> Blend:
    """The blend of a run of ``recipe`` on ``index`` (its training split): what the trainer draws
    from, and what ``bloomline train`` checks before any rank starts (a cap the data cannot meet)."""
    return Blend(
        recipe.batch.blend,
        {lang: index.lang_tokens(lang) for lang in index.languages},
        index.manifest["blend"],
        planned_tokens(recipe.batch, recipe.train.steps),
        recipe.train.steps,
    )
