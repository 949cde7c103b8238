"""One rank's place in the grid (training/parallel/distributed.py): data parallelism alone starts
without megatron-core, whose import (torch.compile's stack with it) is seconds of every rank's start."""

import os
import subprocess
import sys
from pathlib import Path

from training.loop.launch import free_port

REPO = Path(__file__).resolve().parents[3]

RANK = """
import sys
from training.config import ParallelConfig
from training.parallel.distributed import init_distributed, tp_rank_and_size

mesh = init_distributed(ParallelConfig(tp={tp}, pp=1, dp=1, backend="gloo"), seed=0)
print(mesh.tp_rank, mesh.dp_rank, mesh.pp_rank, tp_rank_and_size(), any(m.startswith("megatron") for m in sys.modules))
import torch.distributed as dist
from deepspeed.comm import comm
print("shm kernel:", comm.cdb.shm_comm_op is not None, "collectives:", dist.get_backend())
"""


def rank(tp: int) -> str:
    """A one-rank world's init_distributed at ``tp``, in a fresh process: what it prints."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    res = subprocess.run(
        [sys.executable, "-c", RANK.format(tp=tp)], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-2:]


def test_data_parallel_alone_imports_no_megatron_core_and_a_rank_builds_no_shared_memory_kernel():
    """Nor does any rank build or start DeepSpeed's CPU shared-memory all-reduce (only DeepSpeed's
    inference uses it): no compile on a fresh machine, no buffer in /dev/shm; collectives are gloo's."""
    assert rank(1) == ["0 0 0 (0, 1) False", "shm kernel: False collectives: gloo"]
