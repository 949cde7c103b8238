"""A fixed blend rule as the trainer runs it (``batch.mixture: fixed``, training/data/mixture/blend.py),
with the interface of the online mixture (training/data/mixture/online.py), so the trainer runs
either alike: the start recorded in ``RUN_DIR/mixture.jsonl``, and a schedule's moves, each
recorded before the sampler applies it, so that the metrics and the dashboard's mixture page show
what every rule drew from. A resumed run takes the weights of its next step from the rule itself
(a function of the step), so it draws what an uninterrupted run would; nothing of it is
checkpointed (``state_dict`` is None) beyond the rule's identity (training/CHECKPOINT.md ``blend``)."""

from __future__ import annotations

import json
import zlib
from typing import Any, Optional

from bloomline.errors import ConfigError
from training.checkpoint.run_dir import RunDir
from training.data.mixture.blend import Blend
from training.data.mixture.controller import Change
from training.data.mixture.log import MixtureLog
from training.data.sampler import DynamicBatchSampler


class FixedMixture:
    def __init__(self, blend: Blend, run: RunDir, sampler: DynamicBatchSampler, rank: int):
        self.blend, self.sampler = blend, sampler
        self.log = MixtureLog(run, rank)

    def fingerprint(self) -> int:
        """crc32 of the weights the sampler draws from: the trainer checks that every rank has the same."""
        return zlib.crc32(json.dumps(self.sampler.weights, sort_keys=True).encode())

    def start(self, step: int) -> Optional[Change]:
        """A fresh run (``step`` 0): the rule's weights for step 1 recorded as step 0's decision."""
        if step:
            return None
        c = Change(0, self.blend.weights_for(1), {"rule": "start", "blend": self.blend.describe(1)})
        self.log.record(c)
        return c

    def row(self, step: int) -> list[float]:
        """No evaluation feedback goes into the step's all-gather."""
        return []

    def after_step(self, step: int, *measured: Any, **_: Any) -> list[Change]:
        """After step ``step``: a schedule's move to the next step's weights, recorded, then
        applied (the step's losses, which an online rule reads, are not needed)."""
        if not self.blend.moves_at(step + 1):
            return []
        c = Change(step, self.blend.weights_for(step + 1), self.blend.describe(step + 1))
        self.log.record(c)
        self.sampler.set_weights(c.weights)
        return [c]

    def state_dict(self) -> None:
        return None

    def resume(self, state: Optional[dict[str, Any]], step: int) -> None:
        """Continue after the checkpoint at ``step`` (``state``: its ``mixture`` field) with the
        weights of step ``step + 1``."""
        if state is not None:
            raise ConfigError(
                "batch.mixture",
                f"the checkpoint at step {step} was trained with an online mixture; resume it with "
                f"the same setting (a fixed blend now would silently change the data)",
            )
        if self.blend.moves:
            self.sampler.set_weights(self.blend.weights_for(step + 1))

    def cut_log(self, step: int) -> None:
        self.log.cut(step)
