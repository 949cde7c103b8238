"""torch.distributed and megatron-core's model-parallel groups for one rank.

:func:`init_distributed` starts torch.distributed (gloo on CPU, nccl on GPUs) and, where the layout
has TP or PP, megatron-core's groups; their rank order — tp fastest, then dp, then pp — is the order
of DeepSpeed's ``PipeModelDataParallelTopology``, so both frameworks agree on every group (checked).
Data parallelism alone needs no megatron-core: every rank is a replica and DeepSpeed's own world
group is the DP group.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from training.config import ParallelConfig
from training.parallel.rendezvous import INIT_METHOD
from training.parallel.shm import unlink_own_buffer


@dataclass
class Mesh:
    """This rank's place in the TP × DP × PP grid."""

    rank: int
    world: int
    tp: int
    dp: int
    pp: int
    tp_rank: int
    dp_rank: int
    pp_rank: int


# Ranks started by srun or mpirun directly (DeepSpeed's slurm / openmpi / mpich runners) have no
# launcher setting torch's variables; each launcher names them its own way.
LAUNCHER_RANK_ENV = (
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)


def rank_env_from_launcher(env: Any = os.environ) -> None:
    """Set RANK, WORLD_SIZE and LOCAL_RANK from srun's or mpirun's variables when they are unset."""
    if "RANK" in env:
        return
    for rank, size, local in LAUNCHER_RANK_ENV:
        if rank in env and size in env:
            env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = env[rank], env[size], env.get(local, "0")
            return


def _without_cpu_shm_all_reduce() -> None:
    """DeepSpeed's CPU backend compiles a shared-memory all-reduce kernel (about 50 s on a fresh
    machine, once) and starts it in every rank, each with a 66 MiB buffer in /dev/shm that it never
    frees (training/parallel/shm.py). Only its inference all-reduce uses that kernel
    (deepspeed/comm/torch.py ``inference_all_reduce``, for DeepSpeed-Inference's injected layers);
    training's and evaluation's collectives go through torch.distributed. So bloomline's ranks go
    without it: DeepSpeed takes a missing kernel as one its machine cannot build."""
    import importlib

    # by module name: the package's attribute ``deepspeed.comm.torch`` is PyTorch (``from .comm import *``)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def init_distributed(parallel: ParallelConfig, seed: int) -> Mesh:
    import deepspeed

    rank_env_from_launcher()
    backend = parallel.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        # Before any communicator exists: NCCL binds each one to the current device, and with
        # every rank still on cuda:0 the ranks of a node would collide on one GPU.
        # modulo: launchers that give each process one GPU (srun) still number LOCAL_RANK 0..n-1
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if not torch.distributed.is_initialized():
        if not torch.cuda.is_available():
            _without_cpu_shm_all_reduce()
        # rank 0's store listens on MASTER_ADDR only, not on every interface (training/parallel/rendezvous.py)
        deepspeed.init_distributed(dist_backend=backend, verbose=False, init_method=INIT_METHOD)
        torch.distributed.barrier()  # every rank has mapped every rank's CPU all-reduce buffer by now
        unlink_own_buffer(torch.distributed.get_rank())  # no kill can leave it in /dev/shm (training/parallel/shm.py)
    world = torch.distributed.get_world_size()
    parallel.check_world(world)
    rank = torch.distributed.get_rank()
    if parallel.tp == 1 and parallel.pp == 1:
        # No megatron-core import at all: a rank's start without it, measured on a 2-core AMD EPYC
        # (one rank, 2 steps): 13.1 -> 11.8 s. (DeepSpeed imports torch.compile's stack either way.)
        mesh = Mesh(rank, world, 1, world, 1, 0, rank, 0)
    else:
        from megatron.core import parallel_state, tensor_parallel

        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp
        )
        mesh = Mesh(
            rank,
            world,
            parallel.tp,
            parallel.dp,
            parallel.pp,
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )
    # Cross-check with DeepSpeed's topology: the two frameworks must agree on who is who.
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topo = PipeModelDataParallelTopology(num_pp=parallel.pp, num_mp=parallel.tp, num_dp=parallel.dp)
    coord = topo.get_coord(rank)
    assert (coord.pipe, coord.data, coord.model) == (mesh.pp_rank, mesh.dp_rank, mesh.tp_rank), (coord, mesh)
    if torch.cuda.is_available() and parallel.tp > 1:
        # megatron's CUDA RNG tracker, which its TP layers expect to exist
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return mesh


def tp_rank_and_size() -> tuple[int, int]:
    """(TP rank, TP size); (0, 1) where megatron's groups do not exist (before they are made, or
    never, with data parallelism alone)."""
    parallel_state = sys.modules.get("megatron.core.parallel_state")  # never imported just to ask
    if parallel_state is None or not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


class DeepSpeedMPU:
    """megatron-core's groups in the interface DeepSpeed expects as ``mpu`` (without PP, where no
    pipeline grid tells DeepSpeed which ranks are tensor-parallel peers rather than replicas)."""

    def __init__(self) -> None:
        from megatron.core import parallel_state as ps

        self.ps = ps

    def get_model_parallel_rank(self) -> int:
        return self.ps.get_tensor_model_parallel_rank()

    def get_model_parallel_world_size(self) -> int:
        return self.ps.get_tensor_model_parallel_world_size()

    def get_model_parallel_group(self) -> Any:
        return self.ps.get_tensor_model_parallel_group()

    # the same under megatron's newer names (DeepSpeed's universal-checkpoint loader asks for these)
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return self.ps.get_data_parallel_rank()

    def get_data_parallel_world_size(self) -> int:
        return self.ps.get_data_parallel_world_size()

    def get_data_parallel_group(self) -> Any:
        return self.ps.get_data_parallel_group()
