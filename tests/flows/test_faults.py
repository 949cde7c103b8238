"""Faults a user meets from outside end in one true line: Ctrl-C during training (flows/run/interrupt.py)
and a full disk (bloomline/disk.py), each through the real `bloomline` command, then a rerun
that gives what an undisturbed run gives."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bloomline.disk import DiskFull, disk_full_error, full_disk
from tests.support.prepare_runs import tree_bytes

REPO = Path(__file__).resolve().parents[2]
BLOOMLINE = [sys.executable, "-m", "flows.cli.app"]


def cli(*args, timeout=600):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run(
        [*BLOOMLINE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def job_processes(driver_pid: int) -> list[psutil.Process]:
    """The live processes that carry the job token of the driver ``driver_pid`` (flows/run/lifeline.py)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("BLOOMLINE_JOB", "").startswith(
                f"{driver_pid}."
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_a_full_disk_is_told_from_other_write_failures(tmp_path):
    with pytest.raises(OSError) as e:  # /dev/full: every write fails with ENOSPC, as on a full disk
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 100_000)
    assert full_disk(e.value, tmp_path)
    try:  # wrapped, as Prefect and Dask re-raise it
        raise RuntimeError("task failed") from e.value
    except RuntimeError as wrapped:
        assert full_disk(wrapped, tmp_path)
    assert not full_disk(PermissionError(13, "Permission denied"), tmp_path)
    # torch's zip writer says only "file write failed": a full disk only where space is nearly gone
    bare = RuntimeError(
        "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/3: file write failed"
    )
    assert not full_disk(bare, tmp_path)
    err = disk_full_error(OSError(28, "No space left on device", str(tmp_path / "run" / "x.tmp")), tmp_path)
    assert isinstance(err, DiskFull) and str(err).startswith(f"the disk holding {tmp_path / 'run'} is full")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MB tmpfs (root only: skipped where mounting is not allowed) and ``grow(mb)``, which resizes it."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")

    def grow(mb: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mb}m", str(mnt)], check=True)

    try:
        yield mnt, grow
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def last_line(text: str) -> str:
    return [l for l in text.splitlines() if l.strip()][-1]


@pytest.mark.slow
def test_a_full_disk_ends_prepare_train_and_evaluate_in_one_line(demo_data, tiny_disk):
    disk, grow = tiny_disk
    """prepare into a 1 MB filesystem: the last line names the folder and says the disk is full,
    exit 2, no traceback from any process; with more space the same command finishes byte for
    byte as an undisturbed run. Then a training run whose second checkpoint finds no space stops
    at once (no restart) in one line, and an evaluation with no space for its results too."""
    out = disk / "data"
    res = cli("prepare", "--out", out)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert last_line(res.stderr).startswith(f"error: the disk holding {out}") and "is full" in last_line(res.stderr)
    grow(200)
    res = cli("prepare", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert tree_bytes(out) == tree_bytes(demo_data)

    # training: room for the first checkpoint (6.5 MB) and not the second
    run = disk / "run"
    used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    grow((used >> 20) + 10)
    res = cli(
        "train",
        "--data",
        demo_data,
        "--out",
        run,
        "-o",
        "train.steps=4",
        "-o",
        "checkpoint.interval=2",
        "-o",
        "evaluation.settings.tasks=[]",
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    line = last_line(res.stderr)  # the ranks' checkpoint, or the flow's own write, whichever found no space first
    assert line.startswith("error: ") and f"the disk holding {run}" in line and "is full" in line, line
    assert [p.name for p in run.glob("logs/run-*/attempt-*.log")] == ["attempt-1.log"]  # no restart spent
    # the evaluation of the checkpoint that was saved: no space for its results either
    res = cli(
        "evaluate",
        "--checkpoint",
        run / "checkpoints" / "step_2",
        "--data",
        demo_data,
        *("-o", "max_tokens_per_lang=50", "-o", "tasks=[]", "-o", "prompts_per_lang=0"),
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert "is full" in last_line(res.stderr)


@pytest.mark.slow
def test_ctrl_c_ends_every_process_of_a_training_job_in_one_line_and_the_rerun_is_identical(demo_data, tmp_path):
    """SIGINT to the command's process group, as a terminal's Ctrl-C sends it, during `bloomline
    train` at DP=2 with its evaluation watcher: within 15 s no process of the job is left, no
    traceback reaches the output, one line says where it stopped, exit 130; the same command then
    resumes and every step's loss equals the one logged before the interruption."""
    out = tmp_path / "run"
    cmd = [
        *BLOOMLINE,
        "train",
        "--data",
        str(demo_data),
        "--out",
        str(out),
        "-o",
        "parallel.dp=2",
        "-o",
        "train.steps=6",
        "-o",
        "checkpoint.interval=2",
        "-o",
        "evaluation.settings.tasks=[]",  # the watcher runs (bits per byte), without the continuation task's cost
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    assert len(job_processes(proc.pid)) >= 4  # server, launcher, 2 ranks, watcher
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    while job_processes(proc.pid) and time.monotonic() - t0 < 15:
        time.sleep(0.2)
    assert not job_processes(proc.pid) and time.monotonic() - t0 < 15
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output
    line = last_line(output)
    assert (
        line.startswith("stopped by Ctrl-C at step ")
        and line.endswith("(a rerun resumes from checkpoint step_2); run the same command to resume")
        or line.endswith("(a rerun resumes from checkpoint step_4); run the same command to resume")
    ), line
    from training.loop.metrics_log import read_metrics

    before = read_metrics(metrics)[0]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    after = {r["step"]: r for r in read_metrics(metrics)[0]}
    assert sorted(after) == list(range(1, 7))
    for r in before:
        assert (after[r["step"]]["loss"], after[r["step"]]["grad_norm"]) == (r["loss"], r["grad_norm"]), r["step"]


def eval_ranks(driver_pid: int) -> list[psutil.Process]:
    """Live ranks of a parallel evaluation (eval/parallel/main.py) of the driver's job."""
    found = []
    for p in job_processes(driver_pid):
        try:
            if any(a.endswith("eval/parallel/main.py") for a in p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_a_killed_rank_of_a_parallel_evaluation_skips_that_checkpoint_and_training_finishes(demo_data, tmp_path):
    """`bloomline train` with evaluation.settings.parallel.pp=2: each checkpoint is evaluated on 2
    ranks beside training. SIGKILL to a rank of the first evaluation makes that checkpoint a
    skipped record whose reason is one line; training finishes, the other checkpoint is evaluated
    in the evaluation's layout, and no rank is left."""
    from eval.results.table import read_results, skipped_steps

    out = tmp_path / "run"
    cmd = [
        *BLOOMLINE,
        "train",
        "--data",
        str(demo_data),
        "--out",
        str(out),
        *("-o", "train.steps=4", "-o", "checkpoint.interval=2"),
        *("-o", "evaluation.settings.parallel.pp=2", "-o", "evaluation.settings.tasks=[]"),
        *("-o", "evaluation.settings.max_tokens_per_lang=100", "-o", "evaluation.settings.prompts_per_lang=0"),
    ]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killed = None
    deadline = time.time() + 500
    while killed is None and time.time() < deadline and proc.poll() is None:
        for p in eval_ranks(proc.pid):
            if "--local_rank=1" in p.cmdline():  # the serving rank of the pipeline's last stage
                p.kill()
                killed = p.pid
                break
        time.sleep(0.05)
    assert killed, "no evaluation rank was seen"
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    skipped = skipped_steps(out)
    assert len(skipped) == 1, (skipped, output[-2000:])
    ((step, why),) = skipped.items()
    assert "\n" not in why and "a rank was killed by SIGKILL" in why, why
    rows = read_results(out).to_pylist()
    assert {r["step"] for r in rows} == {2, 4} - {step}
    assert {r["eval_layout"] for r in rows} == {"tp=1 pp=2 device=cpu"}
    assert not eval_ranks(proc.pid)
