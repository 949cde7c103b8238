"""Start a training job: a launcher (one process per rank; DeepSpeed's on several nodes) in its own process group.

Free of Prefect, so that the flow ``train`` and the GPU validation script (bench/gpu_validate.py,
run where Prefect is not installed) start jobs the same way.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

from bloomline.disk import FULL_ERRNOS
from bloomline.errors import ConfigError
from bloomline.secrets import copy_masked
from training.parallel.shm import release_job_shm

# Exit statuses of a job (the launcher passes on the first failing rank's):
EXIT_OK = 0
EXIT_USER_ERROR = 2  # training/loop/main.py: a configuration or data problem (BloomlineError); a restart cannot help
TIMED_OUT = 124  # run_job's exit status when the job outlived its timeout (as timeout(1))
# anything else: a crash (a killed rank, a hardware fault, a bug), which a restart from `latest` may get past


def leave(status: int) -> NoReturn:
    """End a rank's process (training's or an evaluation's) with ``status``, its output flushed,
    without the interpreter's teardown: with torch.distributed still up, destroying its (gloo /
    DeepSpeed comm) objects while their threads run can abort the process ("terminate called
    without an active exception", SIGABRT seen in CI after a rank's last step and after a user
    error), so that a finished job or a user's mistake reads as a crash. Call it only once
    everything the rank writes is complete."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MULTI_NODE_PORT = 29500  # torch.distributed's usual port: every node must agree on one, so no free-port pick


def hostfile_slots(hostfile: str | Path) -> dict[str, int]:
    """``{host: slots}`` of a DeepSpeed hostfile, parsed by DeepSpeed's own parser; ValueError
    naming the file when it is missing, empty or malformed."""
    from deepspeed.launcher.runner import fetch_hostfile

    if not Path(hostfile).is_file():
        raise ValueError(f"hostfile not found: {hostfile}")
    try:
        pool = fetch_hostfile(str(hostfile))
    except ValueError as e:
        raise ValueError(f"{hostfile}: {e}") from None
    if not pool:
        raise ValueError(f"{hostfile}: no hosts (lines of the form 'host slots=N')")
    return dict(pool)


def launch_command(
    recipe_file: str | Path, data_dir: str | Path, out: str | Path, world: int, launch: Any = None
) -> list[str]:
    """The launcher starting ``world`` ranks of training/loop/main.py: on this node, or on
    the hostfile's nodes (``launch``: a training.config.LaunchConfig)."""
    main = Path(__file__).resolve().parent / "main.py"
    return launcher(world, launch) + [
        str(main),
        "--recipe",
        str(recipe_file),
        "--data",
        str(data_dir),
        "--out",
        str(out),
    ]


def launcher(world: int, launch: Any = None) -> list[str]:
    """The launcher's command for ``world`` ranks, to be followed by the ranks' script
    and its arguments: on this node, or on the hostfile's nodes (``launch``: a
    training.config.LaunchConfig). Run as a module of this interpreter, so it needs no
    ``deepspeed`` script on PATH. Training's and the parallel evaluation's ranks start this way.

    On one node, training/loop/node_launch.py: DeepSpeed's per-node launcher's command line,
    environment and exit status without its imports, given the world DeepSpeed's runner would
    give it (deepspeed/launcher/runner.py ``main``, its single-node branch: ``localhost`` with
    slots 0..world-1, master 127.0.0.1, nothing else exported). DeepSpeed's runner and launcher
    would each add a Python start that imports torch and DeepSpeed (2.5-3 s of a CPU, measured on
    a 2-core AMD EPYC) before the ranks can begin to start."""
    if launch is None or launch.hostfile is None:
        port = launch.master_port if launch is not None and launch.master_port else free_port()
        world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(world))}).encode()).decode()
        return [
            *(sys.executable, "-u", "-m", "training.loop.node_launch", f"--world_info={world_info}"),
            *("--master_addr", "127.0.0.1", "--master_port", str(port)),
        ]
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner"]
    cmd += [
        "--hostfile",
        str(Path(launch.hostfile).resolve()),
        "--launcher",
        launch.launcher,
        "--master_port",
        str(launch.master_port or MULTI_NODE_PORT),
    ]
    if launch.master_addr:
        cmd += ["--master_addr", launch.master_addr]
    if launch.launcher_args:
        cmd += [f"--launcher_args={launch.launcher_args}"]  # one token: its value may start with "--"
    if launch.no_ssh:
        cmd += ["--no_ssh", "--node_rank", str(launch.node_rank)]
    return cmd


def launch_env(launch: Any, env: dict[str, str], env_file: Path) -> dict[str, str]:
    """The launcher's environment: the recipe's NCCL_* settings, and for several nodes a
    DeepSpeed environment file (``DS_ENV_FILE``) with them and the rendezvous address, which
    DeepSpeed's pdsh/mpirun/srun runners export to every rank on every node."""
    env = {**env, **launch.nccl}
    if launch.hostfile is None:
        return env
    lines = dict(launch.nccl)
    if launch.master_addr:
        lines["MASTER_ADDR"] = launch.master_addr  # srun / mpirun start ranks with no launcher to set it
    lines["MASTER_PORT"] = str(launch.master_port or MULTI_NODE_PORT)
    env_file.parent.mkdir(parents=True, exist_ok=True)
    # the real values, for DeepSpeed to export: readable by this user only, and removed with the
    # job (flows/stages/train.py), so no run folder keeps them
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in lines.items()))
    env["DS_ENV_FILE"] = str(env_file.resolve())  # an absolute name: DeepSpeed joins it to ~ and . and gets it back
    return env


def spawn_logged(
    cmd: list[str], log_file: Path, env: dict[str, str], cwd: str | Path | None = None
) -> tuple[subprocess.Popen, threading.Thread]:
    """Start ``cmd`` in its own session, its output (stdout and stderr) appended to ``log_file``
    with secrets masked as it comes (bloomline.secrets.copy_masked, a thread of this process)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )
    log = open(log_file, "ab", buffering=0)  # each line is written as it comes (copy_masked flushes anyway)

    def copy() -> None:
        with log:
            try:
                copy_masked(proc.stdout, log)
            except OSError as e:
                if e.errno not in FULL_ERRNOS:
                    raise
                # the log's disk is full: the child's output is dropped, never left to fill the pipe
                # and block the child (the command says the disk is full, bloomline/disk.py)
                for _ in iter(proc.stdout.readline, b""):
                    pass

    copier = threading.Thread(target=copy, name=f"log {log_file.name}", daemon=True)
    copier.start()
    return proc, copier


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a child started in its own session (what it started too), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_job(
    cmd: list[str],
    log_file: Path,
    env: dict[str, str],
    timeout: float | None = None,
    cwd: str | Path | None = None,
    poll: Callable[[], None] | None = None,
    poll_s: float = 2.0,
) -> int:
    """Run ``cmd`` in its own session, output appended to ``log_file``; its exit status, or
    TIMED_OUT. ``poll()`` is called every ``poll_s`` seconds while it runs (progress reports).
    However it ends (exit, timeout, our interruption), the whole process group is killed — a
    dead rank's peers would hang in a collective — and its shared memory released."""
    deadline = None if timeout is None else time.monotonic() + timeout
    proc, copier = spawn_logged(cmd, log_file, env, cwd)
    try:
        while True:
            wait = poll_s if poll else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return TIMED_OUT
                wait = left if wait is None else min(wait, left)
            try:
                return proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                if poll:
                    poll()
    finally:
        kill_group(proc)
        copier.join(timeout=30)  # a child that escaped the group could hold the pipe open
        release_job_shm(cmd)


def check_hostfile(launch: Any, world: int) -> None:
    """A hostfile (``launch.hostfile``) must hold exactly the layout's tp·pp·dp ranks."""
    if launch.hostfile is None:
        return
    try:
        slots = hostfile_slots(launch.hostfile)
    except ValueError as e:
        raise ConfigError("launch.hostfile", str(e)) from None
    if sum(slots.values()) != world:
        raise ConfigError(
            "launch.hostfile",
            f"{launch.hostfile} has {sum(slots.values())} slots on {len(slots)} node(s), "
            f"the layout needs tp·pp·dp = {world} ranks",
        )
    if launch.no_ssh and launch.node_rank >= len(slots):
        raise ConfigError("launch.node_rank", f"{launch.node_rank}, but {launch.hostfile} lists {len(slots)} node(s)")


def cpu_comm_kernel_built() -> bool:
    """Whether DeepSpeed's CPU communication kernel (``deepspeed_shm_comm``, built just in time
    with torch's C++ extension loader, about 30 s on 2 cores) is in torch's extension cache, so
    the ranks' first step does not wait for a compiler."""
    try:  # torch's own rule for where its JIT loader builds (the folder it names is created, empty, if absent)
        from torch.utils.cpp_extension import _get_build_directory
    except ImportError:
        return True  # cannot tell: say nothing
    return (Path(_get_build_directory("deepspeed_shm_comm", False)) / "deepspeed_shm_comm.so").is_file()
