"""Entry point of one training rank: ``python -m training.loop.main --recipe R.json --data DIR --out RUN``.

Started once per rank by the job's launcher (training/loop/launch.py; ``bloomline train`` / the
Prefect flow ``train`` start it); it reads the fully resolved recipe the flow wrote, so every
rank trains exactly the same configuration. Exit status (``training/loop/launch.py``): EXIT_OK when done or stopped by the
kill switch; EXIT_USER_ERROR, after printing ``error: <message>`` to stderr, for a problem with
the configuration or the data, or a full disk, which a restart cannot fix; anything else is a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from bloomline.config import from_dict
from bloomline.errors import BloomlineError
from training.config import TrainRecipe
from training.loop.launch import EXIT_OK, EXIT_USER_ERROR, leave


def main(argv: list[str] | None = None) -> NoReturn:
    """One rank's run; the process ends here with EXIT_OK, EXIT_USER_ERROR, or a crash's status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True, help="resolved recipe (JSON) written by the train flow")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--local_rank", type=int, default=0)  # passed by the launcher, as DeepSpeed's passes it
    args = ap.parse_args(argv)
    from training.checkpoint.resume import seed_everything
    from training.loop.trainer import Trainer

    try:
        with open(args.recipe, encoding="utf-8") as f:
            recipe = from_dict(TrainRecipe, json.load(f))
        recipe.resolve_paths(Path("."))
        if nothing_compiles(recipe):
            # DeepSpeed's ZeRO optimizer check imports its Muon optimizer, and megatron-core its fused
            # functions, each torch.compile'd at import: that loads TorchDynamo and Inductor, 1.7 s of
            # a bloom-tiny rank's 8 s start on a 2-core AMD EPYC (1.8 s more with megatron-core's TP/PP
            # layers). TorchDynamo's own switch, read when compile is called, makes them plain functions.
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        seed_everything(recipe.train.seed)
        try:
            Trainer(recipe, args.data, args.out).train()
        except Exception as e:
            from bloomline.disk import disk_full_error, full_disk

            # a checkpoint or a metrics line that found no space: the same on every restart
            if not isinstance(e, BloomlineError) and full_disk(e, args.out):
                raise disk_full_error(e, args.out) from None
            raise
    except BloomlineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        leave(EXIT_USER_ERROR)  # nothing is left to save
    # every file the rank writes is complete by now: checkpoints saved, metrics and TensorBoard
    # flushed each step (training/loop/metrics_log.py)
    leave(EXIT_OK)


def nothing_compiles(recipe: TrainRecipe) -> bool:
    """Whether no part of this rank's training is ``torch.compile``'d: ``train.compile`` off and
    attention sdpa, named so or ``auto`` without a GPU (FlexAttention, which is compiled, has no
    CPU backward: training/loop/kernel_choice.py)."""
    import torch

    attention = getattr(recipe.model, "attention", "auto")
    return not recipe.train.compile and (attention == "sdpa" or (attention == "auto" and not torch.cuda.is_available()))


if __name__ == "__main__":
    main()
