"""The skip and spike rules of the training loop (training/loop/trainer.py).

A bad batch (NaN/inf loss, a loss above ``train.skip_spike_factor`` × the running mean, or the
``BLOOMLINE_NAN_AT`` drill) is skipped on every rank alike: training/loop/loss.py makes its loss
NaN and DeepSpeed skips the optimizer step. :class:`SkipGuard` tells such a skip apart from an fp16
loss-scaler overflow, counts both, keeps the running mean loss the spike limit is taken from, and
stops the run after ``train.max_skipped_in_a_row`` bad batches in a row. Its counters are the
``trainer`` field of a checkpoint's bloomline.json (contract 2, training/CHECKPOINT.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bloomline.errors import BloomlineError
from training.config import TrainLoopConfig
from training.loop.loss import StepLoss


class SkipGuard:
    """One rank's skip and spike rules and their counters (see the module docstring)."""

    def __init__(self, train: TrainLoopConfig, rank: int, device: torch.device):
        self.train = train
        self.rank = rank
        self.device = device
        self.skipped = 0  # bad batches skipped
        self.skipped_in_a_row = 0
        self.overflows = 0  # fp16 steps skipped by the loss scaler
        self.loss_ema: float | None = None  # running mean of the unskipped steps' losses

    def spike_limit(self) -> float:
        """The loss above which the next step's batch is skipped (inf: no spike rule, or no mean yet)."""
        f = self.train.skip_spike_factor
        return f * self.loss_ema if (f and self.loss_ema is not None) else math.inf

    def verdict(self, optimizer_skipped: bool, loss: StepLoss) -> str | None:
        """Why the step's optimizer update was skipped: None (it was not), ``"bad_loss"`` or
        ``"fp16_overflow"``. ``optimizer_skipped`` comes from DeepSpeed's overflow check, which is
        global, so every rank calls this alike; then it is a collective (only the last pipeline
        stage computed the loss, so every rank is asked whether its ``loss`` was bad)."""
        if not optimizer_skipped:
            return None
        bad = torch.tensor([int(loss.bad)], device=self.device)
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        # With fp16 a clean loss can still overflow the scaled gradients: that is the loss
        # scaler calibrating itself (it halves the scale), not a bad batch.
        return "bad_loss" if bad.item() or self.train.precision != "fp16" else "fp16_overflow"

    def record(self, step: int, loss: float, skip: str | None) -> None:
        """Count step ``step``'s outcome (``skip`` as :meth:`verdict` gave it) and update the
        running mean; rank 0 reports a skipped batch. BloomlineError once more than
        ``train.max_skipped_in_a_row`` batches in a row were skipped."""
        if skip == "bad_loss":
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.rank == 0:
                # the limit the step was judged by: the mean only moves on an unskipped step
                print(
                    f"step {step}: batch skipped (loss {loss}, NaN/inf or above the spike limit "
                    f"{self.spike_limit():.3f})",
                    flush=True,
                )
            if self.skipped_in_a_row > self.train.max_skipped_in_a_row:
                raise BloomlineError(
                    f"{self.skipped_in_a_row} batches in a row skipped for NaN/inf or spiking "
                    f"loss (train.max_skipped_in_a_row={self.train.max_skipped_in_a_row})"
                )
            return
        self.skipped_in_a_row = 0
        if skip is None:
            self.loss_ema = loss if self.loss_ema is None else 0.9 * self.loss_ema + 0.1 * loss
        else:
            self.overflows += 1

    def state_dict(self) -> dict[str, Any]:
        """The counters as a checkpoint keeps them (``trainer`` in bloomline.json)."""
        return {
            "skipped": self.skipped,
            "fp16_overflows": self.overflows,
            "skipped_in_a_row": self.skipped_in_a_row,
            "loss_ema": self.loss_ema,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``trainer`` field."""
        self.skipped = state["skipped"]
        self.skipped_in_a_row = state["skipped_in_a_row"]
        self.overflows = state["fp16_overflows"]
        self.loss_ema = state["loss_ema"]
