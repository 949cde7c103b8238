"""Start a training job: the DeepSpeed launcher (one process per rank) in its own process group.

Free of Prefect, so that the flow ``train`` and the GPU validation script (bench/gpu_validate.py,
run where Prefect is not installed) start jobs the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from training.shm import release_job_shm

# Exit statuses of a job (the DeepSpeed launcher passes on the first failing rank's):
EXIT_OK = 0
EXIT_USER_ERROR = 2  # training/main.py: a configuration or data problem (BloomlineError); a restart cannot help
TIMED_OUT = 124  # run_job's exit status when the job outlived its timeout (as timeout(1))
# anything else: a crash (a killed rank, a hardware fault, a bug), which a restart from `latest` may get past


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(recipe_file: str | Path, data_dir: str | Path, out: str | Path, world: int) -> list[str]:
    """The DeepSpeed launcher starting ``world`` ranks of training/main.py on this node. Run as a
    module of this interpreter, so it needs no ``deepspeed`` script on PATH."""
    main = Path(__file__).resolve().parent / "main.py"
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(world), "--master_port",
            str(free_port()), str(main), "--recipe", str(recipe_file), "--data", str(data_dir), "--out", str(out)]


def run_job(cmd: list[str], log_file: Path, env: dict[str, str], timeout: float | None = None,
            cwd: str | Path | None = None) -> int:
    """Run ``cmd`` in its own session, output appended to ``log_file``; its exit status, or
    TIMED_OUT. However it ends (exit, timeout, our interruption), the whole process group is
    killed — a dead rank's peers would hang in a collective — and its shared memory released."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMED_OUT
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            release_job_shm(cmd)
