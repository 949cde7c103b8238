"""One node's ranks, started as DeepSpeed's per-node launcher starts them, without importing DeepSpeed.

DeepSpeed's launcher (deepspeed/launcher/launch.py ``main``) imports DeepSpeed and torch only to
start processes: 2.5 s of a CPU before the first rank can begin its own imports (measured on a
2-core AMD EPYC); then it looks at its ranks once a second, so a job ends up to a second after
its last rank. On one node bloomline starts the ranks with this module instead, on the same
command line; on several, each node runs DeepSpeed's own (training/loop/launch.py ``launcher``).

    python -u -m training.loop.node_launch --world_info=B64 --master_addr ADDR --master_port PORT SCRIPT [ARGS...]

As DeepSpeed's launcher, for the node ``--node_rank`` (0) of ``--world_info`` (base64 JSON
``{host: [slot, ...]}``): each of its slots runs ``python -u SCRIPT --local_rank=N ARGS...`` with
MASTER_ADDR, MASTER_PORT, WORLD_SIZE, CROSS_RANK, CROSS_SIZE, LOCAL_SIZE, RANK and LOCAL_RANK set,
and CUDA_VISIBLE_DEVICES the node's slots (what DeepSpeed's CUDA and CPU accelerators set). The
first rank to end with a nonzero status ends every rank (SIGTERM to its process tree, SIGKILL
30 s later), is reported as ``... exits with return code = N`` and is the launcher's status;
SIGINT or SIGTERM ends every rank and exits 1. Unlike DeepSpeed's, a rank's end is seen at once.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
from typing import NoReturn

import psutil

GRACE_S = 30.0  # DeepSpeed's launcher waits as long before it SIGKILLs a rank that ignored SIGTERM


def rank_env(world: dict[str, list[int]], node_rank: int, addr: str, port: int) -> tuple[dict[str, str], int]:
    """(the environment every rank of node ``node_rank`` shares, the global rank of its first slot)."""
    nodes = list(world)
    slots = world[nodes[node_rank]]
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, slots)),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(sum(len(s) for s in world.values())),
        "CROSS_RANK": str(node_rank),
        "CROSS_SIZE": str(len(nodes)),
        "LOCAL_SIZE": str(len(slots)),
    }
    return env, sum(len(world[n]) for n in nodes[:node_rank])


def end_trees(pids: list[int]) -> None:
    """SIGTERM these processes and everything they started, together; SIGKILL what is left after
    GRACE_S (one grace period for all of them, not one per rank)."""
    tree: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree += [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            pass
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=GRACE_S)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.loop.node_launch", description=__doc__.split("\n")[0])
    parser.add_argument("--world_info", required=True)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=int, required=True)
    parser.add_argument("--node_rank", type=int, default=0)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args(argv)
    world = json.loads(base64.urlsafe_b64decode(a.world_info))
    env, first = rank_env(world, a.node_rank, a.master_addr, a.master_port)
    local_size = int(env["LOCAL_SIZE"])
    alive: dict[int, tuple[int, subprocess.Popen]] = {}  # pid -> (rank, process), until it is reaped

    def end_all() -> None:
        # only ranks not yet reaped: a reaped rank's pid may already be another process's
        end_trees([proc.pid for _, proc in alive.values()])

    def interrupted(signum: int, frame: object) -> NoReturn:
        end_all()
        sys.exit(1)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    for n in range(local_size):
        rank = first + n
        local = rank % local_size  # DeepSpeed's rule
        cmd = [sys.executable, "-u", a.script, f"--local_rank={local}", *a.args]
        proc = subprocess.Popen(cmd, env={**env, "RANK": str(rank), "LOCAL_RANK": str(local)})
        alive[proc.pid] = (rank, proc)
    while alive:
        pid, status = os.waitpid(-1, 0)  # the next rank to end, the moment it does
        if pid not in alive:
            continue
        rank, proc = alive.pop(pid)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"[rank {rank}: {' '.join(proc.args)}] exits with return code = {code}", file=sys.stderr, flush=True)
            end_all()
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
