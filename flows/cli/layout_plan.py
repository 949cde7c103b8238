"""``bloomline plan``: a training layout's memory per pipeline stage and device, FLOPs, bubble and
fit (training/planning/planner.py), with the evaluation layout of its model (eval/parallel/plan.py),
before any run. Here, in the layer that knows both, and every recipe folder."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from bloomline.errors import BloomlineError


def layout_plan(
    config: Path, gpu: str, nodes: int | None, iteration_seconds: float | None, offload: bool, override: list[str]
) -> dict[str, Any]:
    """The plan of ``config`` (a training or a pipeline recipe, its training part then) on ``gpu``
    (a name of training/planning/planner.py ``DEVICES``, or ``cpu``: this machine), as ``bloomline
    plan --json`` prints it; a bad device or node count is one line."""
    from bloomline.config import load_config
    from eval.beside import evaluator_gpus, where
    from eval.parallel.plan import eval_plan
    from flows.config import schema_for
    from training.config import TrainRecipe
    from training.planning.planner import DEVICES, cpu_device, plan

    if gpu != "cpu" and gpu not in DEVICES:
        raise BloomlineError(f"--gpu {gpu}: use one of {', '.join([*DEVICES, 'cpu'])}")
    schema = schema_for(config) if config.is_file() else TrainRecipe
    recipe = load_config(schema, config, override)
    recipe = getattr(recipe, "train", recipe) if not isinstance(recipe, TrainRecipe) else recipe
    if nodes is not None and nodes < 1:
        raise BloomlineError("--nodes must be >= 1")
    # The plan uses no device; DeepSpeed's notes on choosing one go to stderr, so --json stays pure.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with contextlib.redirect_stdout(sys.stderr):
        device = cpu_device() if gpu == "cpu" else DEVICES[gpu]
        res = plan(recipe, device, nodes, iteration_seconds, offload)
        settings = recipe.evaluation.settings
        precision = settings.precision or ("fp32" if gpu == "cpu" else "bf16")
        res["evaluation"] = eval_plan(recipe.model, device, settings.batch_tokens, precision)
    if gpu != "cpu" and "layout" in res:  # the evaluation beside training: the GPUs of rank 0's node no rank takes
        lay = res["layout"]
        gpus = evaluator_gpus(recipe.evaluation.gpus, lay["per_node"], min(lay["world"], lay["per_node"]))
        res["evaluation"]["beside_training"] = {"gpus": gpus, "where": where(gpus)}
    return res
