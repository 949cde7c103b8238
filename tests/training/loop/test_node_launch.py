"""The one-node launcher (training/loop/node_launch.py): DeepSpeed's per-node launcher's rank
environment and arguments, and its exit status when a rank fails, seen at once."""

import base64
import json
import subprocess
import sys
import time

import psutil

from training.loop.launch import launcher

RANK = """import json, os, sys, time
out, fail = sys.argv[-2], int(sys.argv[-1])
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
env = {k: os.environ.get(k) for k in keys}
open(f"{out}/{env['RANK']}.json", "w").write(json.dumps({"env": env, "argv": sys.argv[1:], "pid": os.getpid()}))
if fail and env["RANK"] == "1":
    sys.exit(fail)
time.sleep(60 if fail else 0)
"""


def run(tmp_path, world, fail):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    cmd, t0 = launcher(world), time.time()
    res = subprocess.run([*cmd, str(script), str(tmp_path), str(fail)], capture_output=True, text=True, timeout=120)
    ranks = {r: json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)}
    return cmd, res, time.time() - t0, ranks


def test_each_rank_gets_deepspeeds_environment_and_arguments(tmp_path):
    cmd, res, _, ranks = run(tmp_path, 3, 0)
    assert cmd[:4] == [sys.executable, "-u", "-m", "training.loop.node_launch"]
    (info,) = [a.split("=", 1)[1] for a in cmd if a.startswith("--world_info=")]
    assert json.loads(base64.urlsafe_b64decode(info)) == {"localhost": [0, 1, 2]}  # DeepSpeed's runner's world
    assert res.returncode == 0, res.stderr
    port = cmd[cmd.index("--master_port") + 1]
    for r, got in ranks.items():
        assert got["env"] == {
            "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3", "LOCAL_SIZE": "3", "CROSS_RANK": "0",
            "CROSS_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": "0,1,2",
        }  # fmt: skip
        assert got["argv"] == [f"--local_rank={r}", str(tmp_path), "0"]


def test_a_failing_rank_ends_the_others_at_once_with_its_status(tmp_path):
    _, res, took, ranks = run(tmp_path, 2, 3)
    assert res.returncode == 3 and took < 30, (res.returncode, took)
    # the line eval/parallel/launch.py reads a rank's end from, as DeepSpeed's launcher writes it
    assert "exits with return code = 3" in res.stderr
    assert not psutil.pid_exists(ranks[0]["pid"]) or psutil.Process(ranks[0]["pid"]).status() == psutil.STATUS_ZOMBIE
