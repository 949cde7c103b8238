"""The job launcher: process-group kill on timeout, and release of DeepSpeed's CPU shm buffers."""

import os
import sys
import time
from pathlib import Path

import pytest

from training.launch import TIMED_OUT, launch_command, run_job
from training.shm import SHM_DIR, master_port, release_job_shm


def test_launch_command_runs_the_deepspeed_runner_of_this_interpreter(tmp_path):
    cmd = launch_command(tmp_path / "r.json", tmp_path / "data", tmp_path / "out", 4)
    assert cmd[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]
    assert cmd[cmd.index("--num_gpus") + 1] == "4" and master_port(cmd) > 0
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
    assert run_job([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], tmp_path / "log.txt", dict(os.environ)) == 3
    assert (tmp_path / "log.txt").read_text().strip() == "hi"
