"""One rank of a parallel evaluation (started by eval/parallel/launch.py through the launcher
training's ranks start from, training/loop/launch.py). Rank 0 runs the evaluation and writes
what it found to ``--result``; the others serve its commands (eval/parallel/ranks.py). A problem of the user's
(a refused checkpoint file, bad settings) is one line ``error: ...`` and exit status 2."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.loop.launch import EXIT_USER_ERROR

if TYPE_CHECKING:
    from eval.evaluate import Evaluation
    from eval.parallel.ranks import StageRunner
    from training.config import EvalConfig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One rank of a parallel evaluation.")
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--settings", required=True, type=Path, help="the evaluation settings (JSON)")
    ap.add_argument("--run", required=True)
    ap.add_argument("--stamp", type=Path)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # the launcher adds it
    args = ap.parse_args(argv)
    from bloomline.errors import BloomlineError

    try:
        return run(args)
    except BloomlineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


def run(args: argparse.Namespace) -> int:
    """This rank's part: rank 0 evaluates through the others and writes ``--result``; every other
    rank serves rank 0's commands until it is done."""
    from bloomline.config import from_dict
    from eval.evaluate import evaluate_with
    from eval.parallel.ranks import RanksModel
    from training.config import EvalConfig

    cfg = from_dict(EvalConfig, json.loads(args.settings.read_text()))
    runner, meta, rank = _stage_runner(args, cfg)
    if rank != 0:
        runner.serve()
        return 0
    model = RanksModel(runner)
    try:
        ev = evaluate_with(
            model,
            meta,
            args.checkpoint,
            args.data,
            cfg,
            args.run,
            args.stamp,
            progress=lambda msg: print(f"progress: {msg}", flush=True),
        )
    finally:
        model.close()
    _write_result(ev, args.result)
    return 0


def _stage_runner(args: argparse.Namespace, cfg: EvalConfig) -> tuple[StageRunner, dict[str, Any], int]:
    """Join the ranks and build this rank's stage of the checkpoint or published model (its layers,
    its tp shard) on its device: (the stage's runner, the checkpoint's meta, this rank)."""
    import torch

    from eval.evaluate import precision_of
    from eval.model import resolve_device
    from eval.parallel.launch import CHECKED
    from eval.parallel.ranks import StageRunner
    from eval.parallel.stage import build_stage
    from eval.published import weights_of
    from training.checkpoint.load import check_files
    from training.checkpoint.meta import PRECISIONS
    from training.config import ParallelConfig
    from training.parallel.distributed import init_distributed

    tp, pp = cfg.parallel.tp, cfg.parallel.pp
    # the node's cores shared by its ranks: torch's default (every core for each rank) oversubscribes
    # them, and the ranks then wait for each other's preempted threads (measured: 88 s -> 27 s for
    # a 4-rank evaluation on 2 cores)
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_SIZE", "1"))))
    meta = json.loads((args.settings.parent / CHECKED).read_text())  # as the driver checked it
    if (meta.get("model") or {}).get("attention") != "flex":
        # nothing here is compiled (sdpa; FlexAttention would be): megatron-core's fused functions,
        # torch.compile'd at import, then load no TorchDynamo and Inductor (1.8 s a rank, 2-core EPYC)
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    mesh = init_distributed(ParallelConfig(tp=tp, pp=pp, dp=1, zero_stage=0), seed=0)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # init_distributed chose it by LOCAL_RANK
    dtype = PRECISIONS[precision_of(cfg, device)]
    if meta.get("kind") is None:  # a checkpoint's files agree with its layout
        check_files(args.checkpoint, meta)
    t0 = time.perf_counter()
    weights, together = weights_of(args.checkpoint, meta, args.data)
    stage = build_stage(weights, together, meta, tp, pp, mesh.pp_rank, device, dtype)
    if mesh.rank == 0:
        print(
            f"progress: rank 0 built its stage ({len(stage.layers)} layers) in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    return StageRunner(stage, tp, pp, mesh.rank, device, dtype), meta, mesh.rank


def _write_result(ev: Evaluation, result: Path) -> None:
    """Rank 0's Evaluation as JSON at ``result`` (written aside and renamed: the launcher reads a
    whole file or none), its timestamps in ISO form."""
    tmp = result.with_name(result.name + f".{os.getpid()}")
    tmp.write_text(
        json.dumps(
            {
                "rows": ev.rows,
                "generations": ev.generations,
                "seconds": ev.seconds,
                "tokens": ev.tokens,
                "task_seconds": ev.task_seconds,
            },
            default=lambda v: v.isoformat() if isinstance(v, dt.datetime) else str(v),
        )
    )
    os.replace(tmp, result)


if __name__ == "__main__":
    from training.loop.launch import leave

    leave(main())  # rank 0's result is written by now
