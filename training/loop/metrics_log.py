"""What rank 0 reports of every step: one JSON line in ``RUN_DIR/metrics.jsonl`` (fields in the
docs/train.md, "Run folder and checkpoints"), the same scalars in TensorBoard under BLOOM's names where they match, and a
progress line every ``train.log_interval`` steps; and the one reader of ``metrics.jsonl``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bloomline.io import write_bytes_atomic
from training.config import TrainRecipe


def read_metrics(path: str | Path, start: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The step records of a ``metrics.jsonl`` from byte ``start``, one per step in step order, and
    the offset after the last whole line read: a line still being written is left for the next
    read, and one a killed job cut off is skipped. A step recorded twice counts as its last
    record: a resumed run's rank 0 drops the rows past its checkpoint before it writes its own
    (:meth:`MetricsLog.truncate`), and a row that outlived that (a kill between the two) is
    superseded by the row the run wrote after it."""
    p = Path(path)
    if not p.is_file():
        return [], start
    with open(p, "rb") as f:
        f.seek(start)
        blob = f.read()
    end = blob.rfind(b"\n") + 1
    by_step: dict[int, dict[str, Any]] = {}
    for line in blob[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            by_step.pop(rec["step"], None)  # the last record of a step counts
            by_step[rec["step"]] = rec
    return sorted(by_step.values(), key=lambda r: r["step"]), start + end


class MetricsLog:
    """Rank 0's record of the run's steps."""

    def __init__(self, metrics: Path, tensorboard: Path, recipe: TrainRecipe):
        self.metrics, self.tensorboard, self.recipe = Path(metrics), Path(tensorboard), recipe
        self._tb = None

    def truncate(self, step: int) -> None:
        """Forget the steps after ``step``: a failed job logged them after its last checkpoint,
        and the resumed run does them again."""
        if self.metrics.exists():
            kept = [json.dumps(r) for r in read_metrics(self.metrics)[0] if r["step"] <= step]
            write_bytes_atomic(self.metrics, "".join(line + "\n" for line in kept).encode())

    def record(self, rec: dict[str, Any]) -> None:
        """Append one step's record; mirror it to TensorBoard; print it every ``log_interval`` steps."""
        step = rec["step"]
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a failed attempt logged after the checkpoint we resumed from
            self._tb = SummaryWriter(str(self.tensorboard), purge_step=step)
        # Named as in BLOOM's TensorBoard (Megatron-DeepSpeed) where they match.
        tb = {
            "lm-loss-training/lm loss": rec["loss"],
            "learning-rate/learning-rate": rec["lr"],
            "batch-size/batch-size": rec["global_batch_tokens"],
            "grad-norm/grad-norm": rec["grad_norm"],
            "iteration-time/tokens-per-second": rec["tokens_per_s"],
            "bloomline/padding_fraction": rec["padding_fraction"],
            "bloomline/dp_balance": rec["dp_balance"],
            "bloomline/dp_time_balance": rec["dp_time_balance"],
            "bloomline/skipped_batches": rec["skipped_batches"],
            "loss-scale/loss-scale": rec["loss_scale"],
            "bloomline/fp16_overflows": rec["fp16_overflows"],
        }
        for lang, v in (rec.get("lang_loss") or {}).items():
            tb[f"lm-loss-training/{lang}"] = v  # per-language training loss (training/loop/loss.py StepLoss)
        for lang, v in (rec.get("mixture_weights") or {}).items():
            tb[f"mixture/{lang}"] = v  # the online mixture's weights, at the steps they change
        for k, v in tb.items():
            if v is not None:
                self._tb.add_scalar(k, v, step)
        self._tb.flush()
        r = self.recipe.train
        if step % r.log_interval == 0 or step == r.steps:
            shown = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            print(
                f"step {step}/{r.steps} | loss {shown(rec['loss'], '.4f')} | lr {rec['lr']:.3g} | "
                f"{shown(rec['tokens_per_s'], ',.0f')} tokens/s | grad norm {shown(rec['grad_norm'], '.3f')} | "
                f"bucket {rec['bucket']} x {rec['micro_batches']} micro-batches"
                + (f" | skipped: {rec['skip_reason']}" if rec["skip_reason"] else ""),
                flush=True,
            )


def finite(v: Any) -> float | None:
    """``v`` as a float, None when it is missing, NaN or infinite (JSON has no NaN)."""
    return float(v) if v is not None and math.isfinite(float(v)) else None
