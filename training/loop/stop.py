"""The kill switch's vote: touching ``RUN_DIR/STOP`` (training/checkpoint/run_dir.py) makes the
trainer save a checkpoint and exit cleanly (training/loop/trainer.py)."""

from __future__ import annotations

from pathlib import Path

import torch


def stop_voted(stop_file: Path, device: torch.device) -> bool:
    """Whether any rank sees ``stop_file``. A collective: every rank calls it at the same point of
    the loop and gets the same answer, since every rank must agree on stopping, or some would
    wait forever in a collective (a shared file system may show the file to some ranks first)."""
    stop = torch.tensor([int(stop_file.exists())], device=device)
    torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
    return bool(stop.item())
