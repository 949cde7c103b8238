"""A job's processes end with its driver (flows/run/lifeline.py), and a folder a job writes has one
owner (flows/run/runlock.py): real processes, real SIGKILLs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows.run import lifeline
from flows.run.runlock import LOCK_FILE, FolderInUse, acquire

REPO = Path(__file__).resolve().parents[3]

# A driver: takes a job token (and a reaper), optionally the lock of a folder, starts a child in
# its own session that starts a grandchild in yet another (as the train flow starts the launcher
# and the launcher the ranks), prints their pids and its reaper's, and waits.
DRIVER = """
import json, subprocess, sys, time
from flows.run import lifeline
from flows.run.runlock import acquire
lifeline.become_driver()
if sys.argv[1]:
    acquire(sys.argv[1], "test driver")
child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                          "g = subprocess.Popen(['sleep', '300'], start_new_session=True); print(g.pid, flush=True); time.sleep(300)"],
                         start_new_session=True, stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
print(json.dumps({"reaper": lifeline._reaper.pid, "child": child.pid, "grandchild": grandchild,
                  "token": lifeline.token()}), flush=True)
time.sleep(300)
"""


def start_driver(folder: Path | None = None) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if k != lifeline.JOB_ENV}
    p = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(folder or "")], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    return p, json.loads(p.stdout.readline())


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_killed_drivers_processes_end_with_it():
    """SIGKILL the driver: its child and grandchild, each in a session of its own (no process group
    or session ties them to it), end within seconds; a process of another job does not."""
    other, o = start_driver()
    driver, d = start_driver()
    try:
        assert psutil.Process(d["grandchild"]).environ()[lifeline.JOB_ENV] == d["token"]  # inherited through both
        assert lifeline.driver_of(d["token"])[0] == driver.pid and lifeline.is_alive(d["token"])
        driver.kill()
        driver.wait()
        assert gone_within([d["child"], d["grandchild"], d["reaper"]], 10)
        assert not lifeline.is_alive(d["token"])
        assert all(alive(o[k]) for k in ("child", "grandchild", "reaper"))  # another job's are left alone
    finally:
        other.kill()
        other.wait()
    assert gone_within([o["child"], o["grandchild"]], 10)  # ... until its own driver ends


def test_a_second_job_on_a_folder_in_use_is_refused_naming_the_holder(tmp_path):
    driver, d = start_driver(tmp_path / "run")
    try:
        holder = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
        assert holder["pid"] == driver.pid and holder["token"] == d["token"]
        with pytest.raises(
            FolderInUse, match=rf"run is in use by pid {driver.pid} on {os.uname().nodename} \(test driver, since "
        ):
            acquire(tmp_path / "run", "test")
        # the command line says the same on one line, exit status 2, before any server starts
        res = subprocess.run(
            [sys.executable, "-m", "flows.cli.app", "prepare", "--out", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert f"is in use by pid {driver.pid} on {os.uname().nodename}" in " ".join(res.stderr.split())
        # within one job the lock is re-entrant: a nested flow, the watcher writing into its run
        env = {**os.environ, lifeline.JOB_ENV: d["token"]}
        nested = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from flows.run.runlock import acquire; print(acquire({str(tmp_path / 'run')!r}, 'nested').nested)",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=60,
        )
        assert nested.stdout.strip() == "True", nested.stderr
    finally:
        driver.kill()
        driver.wait()


def test_a_dead_holders_lock_is_taken_over_and_its_leftovers_ended(tmp_path):
    """The holder and its reaper both SIGKILLed (so nothing ended its processes): the next job
    takes the lock over, says so, and ends the old job's processes before it goes on."""
    driver, d = start_driver(tmp_path / "run")
    os.kill(d["reaper"], signal.SIGKILL)
    driver.kill()
    driver.wait()
    time.sleep(0.5)
    assert alive(d["child"]) and alive(d["grandchild"])  # orphans, still running
    said = []
    with acquire(tmp_path / "run", "test", say=said.append) as lock:
        assert not lock.nested
        assert not alive(d["child"]) and not alive(d["grandchild"])
        assert (
            len(said) == 1
            and f"took over {tmp_path / 'run'} from pid {driver.pid}" in said[0]
            and "ended 2 of its processes" in said[0]
        ), said
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (tmp_path / "run" / LOCK_FILE).read_text() == ""  # released: nothing to take over next time
    with acquire(tmp_path / "run", "test", say=said.append):
        assert len(said) == 1


def test_a_copy_of_a_live_jobs_folder_is_taken_and_that_job_left_running(tmp_path):
    """cp -r of a folder a live job holds copies its lock file, which names that job: taking the
    copy says so and signals none of that job's processes; the original stays held."""
    import shutil

    driver, d = start_driver(tmp_path / "run")
    try:
        shutil.copytree(tmp_path / "run", tmp_path / "copy")
        said = []
        with acquire(tmp_path / "copy", "test", say=said.append) as lock:
            assert not lock.nested
            assert said == [
                f"{tmp_path / 'copy'} is a copy of a folder in use by pid {driver.pid} on {os.uname().nodename} "
                f"(test driver), which still runs: this job takes the copy and leaves that one alone"
            ]
        time.sleep(0.5)
        assert driver.poll() is None and all(alive(d[k]) for k in ("child", "grandchild", "reaper"))
        with pytest.raises(FolderInUse):
            acquire(tmp_path / "run", "test")
        # a lock file naming no job at all (written by hand) is taken over like a dead one's
        (tmp_path / "odd").mkdir()
        (tmp_path / "odd" / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": os.uname().nodename, "token": "x"}))
        said.clear()
        with acquire(tmp_path / "odd", "test", say=said.append):
            assert len(said) == 1 and "which is gone" in said[0]
    finally:
        driver.kill()
        driver.wait()
