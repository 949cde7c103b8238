"""The job launcher: process-group kill on timeout, release of DeepSpeed's CPU shm buffers, and
the multi-node commands DeepSpeed's runner generates from a recipe."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from training.loop.launch import TIMED_OUT, launch_command, run_job
from training.parallel.shm import SHM_DIR, master_port, release_job_shm


def test_one_node_starts_the_node_launcher_of_this_interpreter_with_the_runners_world(tmp_path):
    """On one node, a node launcher directly (training/loop/node_launch.py), with the world
    DeepSpeed's runner would give it."""
    import base64

    cmd = launch_command(tmp_path / "r.json", tmp_path / "data", tmp_path / "out", 4)
    assert cmd[:4] == [sys.executable, "-u", "-m", "training.loop.node_launch"]
    (info,) = [a.split("=", 1)[1] for a in cmd if a.startswith("--world_info=")]
    assert json.loads(base64.urlsafe_b64decode(info)) == {"localhost": [0, 1, 2, 3]}
    assert cmd[cmd.index("--master_addr") + 1] == "127.0.0.1" and master_port(cmd) > 0
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "out")


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_only_the_jobs_own_buffers_are_released():
    port, other = 1, 2  # ports no real job uses
    mine = [SHM_DIR / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_{r}" for r in range(2)]
    theirs = SHM_DIR / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{other}_0"
    for f in [*mine, theirs]:
        f.write_bytes(b"x")
    try:
        assert release_job_shm(["deepspeed", "--master_port", str(port), "main.py"]) == 2
        assert not any(f.exists() for f in mine) and theirs.exists()
        assert release_job_shm(["python", "main.py"]) == 0  # no port, nothing touched
    finally:
        for f in [*mine, theirs]:
            f.unlink(missing_ok=True)


def test_a_job_past_its_timeout_is_killed_with_its_children(tmp_path):
    """The launcher's children (the ranks) must not outlive it: they would keep the GPU."""
    pid_file = tmp_path / "child.pid"
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    t0 = time.time()
    rc = run_job([sys.executable, "-c", script], tmp_path / "log.txt", dict(os.environ), timeout=3)
    assert rc == TIMED_OUT and time.time() - t0 < 20
    child = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the job's child survived the timeout")


def test_a_job_that_exits_returns_its_status(tmp_path):
    assert (
        run_job([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], tmp_path / "log.txt", dict(os.environ)) == 3
    )
    assert (tmp_path / "log.txt").read_text().strip() == "hi"


# ------------------------------------------------------------------------ several nodes
# DeepSpeed's own runner builds the multi-node command; stand-ins for pdsh, mpirun and srun
# (and the ssh it checks nodes with) record what it would run instead of running it.

FAKE = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["BLOOMLINE_FAKE_LOG"], "a") as f:
    f.write(json.dumps({"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]]}) + "\\n")
if os.path.basename(sys.argv[0]) == "ssh" and sys.argv[-1] == "-I":
    print("10.0.0.1")
"""


def generated(tmp_path, launcher: str, hosts: dict[str, int], **launch_values):
    """(argv the runner would start, the LaunchConfig): DeepSpeed's runner run for real on our
    launch command, with recording stand-ins for the launcher binaries on PATH."""
    from training.config import LaunchConfig
    from training.loop.launch import launch_env

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("pdsh", "ssh", "mpirun", "ompi_info", "srun", "sinfo"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h} slots={n}\n" for h, n in hosts.items()))
    launch = LaunchConfig(hostfile=str(hostfile), launcher=launcher, **launch_values)
    launch.validate()
    log = tmp_path / f"{launcher}.jsonl"
    cmd = launch_command(tmp_path / "recipe.json", tmp_path / "data", tmp_path / "run", sum(hosts.values()), launch)
    env = launch_env(
        launch,
        {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "DS_ACCELERATOR": "cpu",
            "BLOOMLINE_FAKE_LOG": str(log),
        },
        tmp_path / "launch.env",
    )
    import subprocess

    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    calls = [json.loads(l)["argv"] for l in log.read_text().splitlines()]
    return next(c for c in calls if c[0] == {"pdsh": "pdsh", "openmpi": "mpirun", "slurm": "srun"}[launcher]), launch


def world_info(argv):
    import base64

    blob = next(a for a in " ".join(argv).split() if a.startswith("--world_info=")).split("=", 1)[1]
    return json.loads(base64.urlsafe_b64decode(blob))


def user_args(argv, tmp_path):
    main = str(Path(__file__).resolve().parents[3] / "training" / "loop" / "main.py")
    i = argv.index(main)
    return argv[i + 1 :]


def test_pdsh_command_for_two_nodes_carries_ranks_rendezvous_and_nccl_settings(tmp_path):
    argv, launch = generated(tmp_path, "pdsh", {"node-a": 2, "node-b": 2}, master_addr="10.0.0.1", master_port=29511)
    assert argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "node-a,node-b"]
    line = " ".join(argv)
    assert "export NCCL_ASYNC_ERROR_HANDLING=1;" in line  # BLOOM's setting, from the recipe's default
    assert "export MASTER_ADDR=10.0.0.1;" in line and "export MASTER_PORT=29511;" in line
    assert "--node_rank=%n" in argv and "--master_addr=10.0.0.1" in argv and "--master_port=29511" in argv
    assert world_info(argv) == {"node-a": [0, 1], "node-b": [0, 1]}
    assert user_args(argv, tmp_path) == [
        "--recipe",
        str(tmp_path / "recipe.json"),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "run"),
    ]
    assert launch.nccl == {"NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_openmpi_and_slurm_commands_start_every_rank_with_the_settings(tmp_path):
    argv, _ = generated(
        tmp_path,
        "openmpi",
        {"node-a": 2, "node-b": 2},
        master_addr="10.0.0.1",
        nccl={"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_IB_TIMEOUT": "22"},
    )
    assert argv[0] == "mpirun" and argv[argv.index("-n") + 1] == "4"
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_IB_TIMEOUT=22", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500"} <= set(
        exported
    )
    argv, _ = generated(
        tmp_path, "slurm", {"node-a": 8, "node-b": 8}, master_addr="node-a", launcher_args="--partition=gpu"
    )
    assert argv[:3] == ["srun", "-n", "16"] and "--partition=gpu" in argv
    export = next(a for a in argv if a.startswith("--export="))
    assert (
        export.startswith("--export=ALL,")
        and "NCCL_ASYNC_ERROR_HANDLING=1" in export
        and "MASTER_ADDR=node-a" in export
    )
    # srun starts main.py itself: each rank takes RANK / WORLD_SIZE / LOCAL_RANK from srun's variables
    from training.parallel.distributed import rank_env_from_launcher

    env = {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5"}
    rank_env_from_launcher(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("13", "16", "5")


def test_bloom_176b_launches_on_48_nodes(tmp_path):
    from bloomline.config import load_config
    from training.config import TrainRecipe
    from training.loop.launch import check_hostfile

    hosts = {f"gpu-{i:02d}": 8 for i in range(48)}
    argv, launch = generated(tmp_path, "pdsh", hosts, master_addr="gpu-00")
    info = world_info(argv)
    assert len(info) == 48 and sum(len(v) for v in info.values()) == 384
    recipe = load_config(
        TrainRecipe,
        Path(__file__).resolve().parents[3] / "configs/train/bloom-176b.yaml",
        [f"launch.hostfile={launch.hostfile}"],
    )
    check_hostfile(recipe.launch, recipe.parallel.world_size)  # 384 slots = TP 4 × PP 12 × DP 8
    recipe.launch.hostfile = str(tmp_path / "short")
    (tmp_path / "short").write_text("gpu-00 slots=8\n")
    with pytest.raises(Exception, match="1 node.*needs tp·pp·dp = 384"):
        check_hostfile(recipe.launch, recipe.parallel.world_size)


def test_the_cpu_kernel_build_is_announced_when_it_is_not_cached(tmp_path, monkeypatch):
    """A fresh machine builds DeepSpeed's CPU communication kernel before the first step (about
    30 s of silence): the train flow says so when torch's extension cache lacks it."""
    from training.loop.launch import cpu_comm_kernel_built

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert not cpu_comm_kernel_built()
    (tmp_path / "deepspeed_shm_comm").mkdir(exist_ok=True)
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert cpu_comm_kernel_built()
