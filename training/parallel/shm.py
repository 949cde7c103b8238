"""Release the shared memory DeepSpeed's CPU all-reduce leaves behind.

bloomline's ranks no longer start that kernel (training/parallel/distributed.py
``_without_cpu_shm_all_reduce``), so they make no such buffer; what follows stays as the net for a
DeepSpeed whose backend makes one another way.

On CPU, DeepSpeed's communication backend creates one shared-memory buffer per rank, named
``deepspeed_allreduce_buffer_{uid}_{master_addr}_{master_port}_{rank}``
(deepspeed/ops/csrc/cpu/comm/shm.cpp, ``shm_initialize``), and never unlinks it — not at a clean
exit, and a SIGKILLed rank could not anyway. /dev/shm is RAM: measured here, a day of test
runs left 22 GiB there (66 MiB per rank per job) until new jobs were killed for memory.

So each rank unlinks its own buffer's name as soon as every rank has mapped every buffer
(:func:`unlink_own_buffer`, right after ``deepspeed.init_distributed``): the memory stays mapped
while the ranks live and goes back when the last one ends, however it ends, as POSIX shared
memory does once unlinked. A job killed during those first moments is the launcher's to clean:
it knows its master port and removes that job's buffers once every rank is gone
(:func:`release_job_shm`).
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")


def master_port(cmd: list[str]) -> int | None:
    """The ``--master_port`` of a DeepSpeed launcher command line."""
    for flag, value in zip(cmd, cmd[1:]):
        if flag == "--master_port":
            return int(value)
    return None


def release_job_shm(cmd: list[str], addr: str = "127.0.0.1") -> int:
    """Unlink the buffers of the (finished) job started by ``cmd``; returns how many."""
    port = master_port(cmd)
    if port is None or not SHM_DIR.is_dir():
        return 0
    n = 0
    for f in SHM_DIR.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_*"):
        f.unlink(missing_ok=True)
        n += 1
    return n


def unlink_own_buffer(rank: int, env: dict[str, str] | None = None) -> bool:
    """Unlink this rank's all-reduce buffer (call it on every rank after a barrier that follows
    ``deepspeed.init_distributed``, when every rank has mapped every buffer); whether there was one
    (there is none on GPUs, nor when the ranks span several nodes)."""
    env = os.environ if env is None else env
    name = SHM_DIR / (
        f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}_{rank}"
    )
    try:
        name.unlink()
        return True
    except FileNotFoundError:
        return False
