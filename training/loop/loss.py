"""The training loss of one micro-batch, as DeepSpeed sees it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from training.model.bloom import IGNORE_INDEX
from training.parallel.distributed import tp_rank_and_size

if TYPE_CHECKING:
    import numpy as np


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per-token cross-entropy over labelled positions, number of them), fp32."""
    per_sample, n = sample_losses(logits, labels)
    return per_sample.sum(), n.sum()


def sample_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample (row): (sum of per-token cross-entropy over labelled positions, number of them), fp32.

    Vocabulary-parallel logits go through megatron-core's ``vocab_parallel_cross_entropy``
    (each rank holds V/tp columns; the softmax normaliser is all-reduced)."""
    mask = labels != IGNORE_INDEX
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    _, size = tp_rank_and_size()
    if size > 1:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        per_token = vocab_parallel_cross_entropy(logits.float(), safe)
    else:
        per_token = F.cross_entropy(logits.float().flatten(0, 1), safe.flatten(), reduction="none").view_as(labels)
    return (per_token * mask).sum(dim=1), mask.sum(dim=1)


class StepLoss:
    """Loss of one micro-batch, scaled so DeepSpeed's averaging gives the step's token mean.

    DeepSpeed divides each micro-batch loss by the number of micro-batches (gas) and averages
    gradients over DP ranks; micro-batches hold different numbers of labelled tokens. Scaling
    the summed token loss by gas·dp / (labelled tokens of the whole step, all ranks) makes the
    final gradient exactly that of the mean token loss of the step.

    Skipping a bad batch: when a micro-batch's mean token loss is not finite, or exceeds
    ``spike_limit``, its loss is made NaN on purpose. The NaN reaches every rank's gradients
    through the all-reduces, DeepSpeed finds the global gradient norm invalid and skips the
    optimizer step on all ranks alike (counted in ``engine.skipped_steps``). ``poison`` does the
    same to a good batch (the ``BLOOMLINE_NAN_AT`` fault drill, training/config/drills.py).

    Per language: given each micro-batch's sample languages (``set_step(langs=...)``, in the
    order the micro-batches run; with PP only the last stage computes losses, in that order),
    it sums each language's token loss and labelled tokens over the step (``lang_loss``,
    ``lang_tokens``), what the online mixture and the metrics read once the step has ended."""

    def __init__(self, languages: int = 0) -> None:
        self.scale = 1.0
        self.spike_limit = math.inf
        self.poison = False
        self.bad = False
        self.languages = languages
        self.langs: list[torch.Tensor] = []
        self.lang_loss = torch.zeros(languages, dtype=torch.float64)
        self.lang_tokens = torch.zeros(languages, dtype=torch.float64)

    def set_step(
        self,
        gas: int,
        dp: int,
        step_tokens: int,
        spike_limit: float = math.inf,
        poison: bool = False,
        langs: list[torch.Tensor] | None = None,
    ) -> None:
        """``langs[g]``: the language index of each sample of micro-batch ``g`` (int64)."""
        self.scale = gas * dp / max(step_tokens, 1)
        self.spike_limit = spike_limit
        self.poison = poison
        self.bad = False
        self.langs = list(langs or [])
        self.lang_loss = torch.zeros(self.languages, dtype=torch.float64)
        self.lang_tokens = torch.zeros(self.languages, dtype=torch.float64)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        per_sample, counts = sample_losses(logits, labels)
        total, n = per_sample.sum(), counts.sum()
        if self.langs:  # summed where the loss lives; the trainer reads the sums once, after the step
            ids = self.langs.pop(0).to(per_sample.device)
            if self.lang_loss.device != per_sample.device:
                self.lang_loss = self.lang_loss.to(per_sample.device)
                self.lang_tokens = self.lang_tokens.to(per_sample.device)
            self.lang_loss.index_add_(0, ids, per_sample.detach().double())
            self.lang_tokens.index_add_(0, ids, counts.double())
        mean = float(total.detach()) / max(int(n), 1)
        if self.poison or not math.isfinite(mean) or mean > self.spike_limit:
            self.bad = True
            return total * float("nan")
        return total * self.scale


def lang_means(languages: list[str], loss: "np.ndarray", tokens: "np.ndarray") -> dict[str, float | None]:
    """Each measured language's mean token loss of the step (languages without a labelled token
    left out, to keep a metrics line short; None for a non-finite loss: JSON has no NaN)."""
    return {l: (float(s / n) if math.isfinite(s / n) else None) for l, s, n in zip(languages, loss, tokens) if n > 0}
