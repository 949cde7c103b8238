"""The Prefect flow ``train``: validate, launch the ranks (training/loop/launch.py), restart
from the latest checkpoint when a rank dies.

The job runs as a subprocess in its own session (``start_new_session``) so that on failure or
cancellation its whole process group — launcher and every rank — is killed: a Prefect timeout
or cancel would not kill children by itself.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypedDict

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bloomline import REPO
from bloomline.config import Location, from_dict, recipe_of, to_dict
from bloomline.errors import BloomlineError
from bloomline.io import write_json_atomic
from bloomline.secrets import mask_tree, masks_exceptions
from bloomline.storage import absolute
from eval.publish import retract_after
from flows.display.progress import TrainProgress
from flows.run.params import InProcess, unmasked
from flows.run.runlock import acquire, owns
from flows.stages.train_job import Checked, check, job_env, ranks_recipe, restarted
from training.checkpoint.integrity import newest_intact
from training.checkpoint.meta import read_meta, saved_recipe, trained_on
from training.checkpoint.mirror import MirrorUploader, pull_latest
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe
from training.data.mixture.online import write_reference
from training.loop.launch import (
    cpu_comm_kernel_built,
    kill_group,
    launch_command,
    run_job,
    spawn_logged,
)
from training.loop.metrics_log import read_metrics
from training.loop.schedule import schedule_change
from training.parallel.layout import layout_label, layout_of

PROGRESS_EVERY_S = 5.0  # seconds between two progress lines while the ranks run


def reshard_if_needed(run: Path, recipe: TrainRecipe, data: str | Path, log_file: Path) -> str | None:
    """When ``latest`` was written with another TP/PP/DP/ZeRO layout than the recipe's, lay it out
    for the recipe's (training/checkpoint/reshard.py) so the ranks can resume from it. Runs the converter
    as a subprocess: it loads whole tensors, and its memory is returned when it ends."""
    from training.checkpoint.reshard import check_convertible, has_universal, reshard_command

    step_dir = RunDir(run).latest_dir()
    if step_dir is None:
        return None
    meta = read_meta(step_dir)
    saved, now = meta["layout"], layout_of(recipe.parallel)
    if saved == now or has_universal(step_dir, now):
        return None
    if not trained_on(meta, data):
        return None  # the trainer refuses it with its message; no conversion for nothing
    try:
        check_convertible(step_dir, meta, now)
    except ValueError as e:
        raise BloomlineError(str(e)) from None
    cmd = reshard_command(step_dir, now)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        rc = subprocess.run(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")},
        ).returncode
    if rc != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise BloomlineError(
            f"converting {step_dir} to the layout {layout_label(now)} failed (see {log_file}):\n" + "\n".join(tail)
        )
    return f"{step_dir.name}: {layout_label(saved)} -> {layout_label(now)}"


def resume_notice(run: Path, recipe: TrainRecipe) -> str | None:
    """What a resume changes that the user should hear about before it starts (the LR schedule)."""
    step_dir = RunDir(run).latest_dir()
    if step_dir is None:
        return None
    meta = read_meta(step_dir)
    return schedule_change(saved_recipe(meta), recipe, meta["step"])


def evaluator_env(recipe: TrainRecipe, env: dict[str, str]) -> dict[str, str]:
    """On a node with GPUs, the watcher's CUDA_VISIBLE_DEVICES: the GPUs no training rank of this
    node takes, or ``evaluation.gpus`` (eval/beside.py); none: the CPU. Nothing on a node without."""
    import torch

    from eval.beside import evaluator_gpus, visible_devices
    from training.loop.launch import hostfile_slots

    node_gpus = torch.cuda.device_count()
    if not node_gpus:
        return {}
    hostfile = recipe.launch.hostfile
    here = next(iter(hostfile_slots(hostfile).values())) if hostfile else recipe.parallel.world_size  # rank 0's node
    gpus = evaluator_gpus(recipe.evaluation.gpus, node_gpus, here)
    return {"CUDA_VISIBLE_DEVICES": visible_devices(gpus, env.get("CUDA_VISIBLE_DEVICES"))}


def start_watcher(
    run: Path, recipe: TrainRecipe, data: str | Path, log_file: Path, env: dict[str, str]
) -> subprocess.Popen:
    """The evaluation watcher (flows/stages/watch.py), in its own session: it evaluates each checkpoint as
    it appears, at a lower priority, in a process that training never waits on."""

    RunDir(run).training_done.unlink(missing_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = dict(env)
    try:  # its flow runs report to this flow's Prefect server (a second one would share its database)
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            env["PREFECT_API_URL"] = str(client.api_url).rstrip("/")
    except Exception:
        pass
    env.update(evaluator_env(recipe, env))
    cmd = [
        sys.executable,
        "-m",
        "flows.stages.watch",
        "--run",
        str(run),
        "--data",
        absolute(data),
        "--recipe",
        str(RunDir(run).recipe),
    ]
    proc, _ = spawn_logged(cmd, log_file, env, cwd=REPO)  # masked as it logs
    return proc


def stop_watcher(
    proc: subprocess.Popen,
    run: Path,
    recipe: TrainRecipe,
    log: Any,
    drain_s: float | None = None,
    why: str | None = None,
) -> dict[str, Any]:
    """Tell the watcher training is over, let it finish what is pending (up to evaluation.drain_s),
    then stop it; what is still pending is recorded as skipped, with the reason."""
    from eval.results.table import evaluated_steps, record_skipped, skipped_steps
    from flows.stages.watch import pending, record_pruned

    RunDir(run).training_done.parent.mkdir(parents=True, exist_ok=True)
    RunDir(run).training_done.touch()
    waiting = pending(run)
    if waiting:
        log.info("training is over; %d checkpoint(s) still to evaluate: %s", len(waiting), waiting)
    drain_s = recipe.evaluation.drain_s if drain_s is None else drain_s
    try:
        proc.wait(timeout=drain_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_group(proc)
    record_pruned(run)
    for step in pending(run):
        record_skipped(
            run,
            step,
            why or f"its evaluation had not finished evaluation.drain_s={drain_s:g} seconds after training ended",
        )
    RunDir(run).hold_file.unlink(missing_ok=True)  # a SIGKILLed watcher could not remove it
    RunDir(run).prune(recipe.checkpoint.keep)  # nothing waits any more
    return {"evaluated": evaluated_steps(run), "skipped": skipped_steps(run)}


class TrainResult(TypedDict):
    """What the train flow hands its caller (the CLI, the pipeline's train stage)."""

    step: int
    """The latest checkpoint's step."""
    steps: int
    """The recipe's steps."""
    last: dict[str, Any]
    """The last metrics.jsonl row (loss, tokens/s, ...)."""
    attempts: int
    stopped_by_kill_switch: bool
    evaluation: Optional[dict[str, Any]]
    """The evaluation watcher's outcome (evaluated and skipped steps), None without one."""


def open_run(r: TrainRecipe, run: Path, reference: Any, log: Any) -> RunDir:
    """The run folder made ready for the ranks: a folder with no checkpoint given the mirror's
    latest (``checkpoint.mirror``), the recipe (for people: secrets masked), what a killed job
    left beyond ``latest`` removed, an online mixture's reference written."""
    run.mkdir(parents=True, exist_ok=True)
    folder = RunDir(run)
    if r.checkpoint.mirror and (pulled := pull_latest(folder, r.checkpoint.mirror)) is not None:
        log.info(
            "the run folder had no checkpoint: resuming from step %d of the mirror %s", pulled, r.checkpoint.mirror
        )
    write_json_atomic(folder.recipe, mask_tree(to_dict(r)))
    # a damaged latest falls back to the newest intact checkpoint, before any rank could fail on it
    resumed_at = newest_intact(folder, log.warning) or 0
    # A killed job may have left checkpoint folders beyond `latest` and evaluations of them: the
    # ranks redo those steps from `latest`, so nothing may read that future meanwhile (this flow
    # writes the run; no rank nor watcher runs yet). Metrics rows past `latest` go when rank 0
    # resumes (training/loop/metrics_log.py), their TensorBoard points with its purge.
    discarded, retracted = folder.discard_unpublished(), retract_after(run, resumed_at)
    if discarded or retracted:
        log.info(
            "resuming at step %d: a killed job's checkpoint folders %s and evaluations of steps %s removed "
            "(this run redoes them)",
            resumed_at,
            discarded or "-",
            retracted or "-",
        )
    if reference is not None:  # checked by validate(), read by every rank from the run folder
        curve, checked = reference
        write_reference(run, curve, checked)
        log.info(
            "mixture reference: %s (%d languages, %d evaluations)",
            r.batch.online.reference,
            checked["languages"],
            checked["evaluations"],
        )
    return folder


def before_ranks(r: TrainRecipe, run: Path, data: str, logs: Path, env: dict[str, str], log: Any) -> None:
    """What the ranks' start needs said or done first: a resume on another layout announced and
    its checkpoint converted, DeepSpeed's one-time CPU kernel build announced."""
    notice = resume_notice(run, r)
    if notice:
        log.warning(notice)
    converted = task(
        masks_exceptions(reshard_if_needed), name="reshard-checkpoint", cache_policy=NONE, persist_result=False
    )(run, r, data, logs / "reshard.log")
    if converted:
        log.info("checkpoint laid out for the new layout (universal checkpoint): %s", converted)
    if env.get("DS_ACCELERATOR") == "cpu" and not cpu_comm_kernel_built():
        log.info(
            "first run on this machine: DeepSpeed builds its CPU communication kernel before the first step "
            "(about 30 s; cached for the runs after)"
        )


def run_ranks(
    r: TrainRecipe, folder: RunDir, data: str, recipe_file: Path, logs: Path, env: dict[str, str], log: Any
) -> int:
    """The ranks, started again from ``latest`` after each failure up to ``checkpoint.max_restarts``
    times, progress logged as they go; the attempts made."""
    world = r.parallel.world_size
    attempts = r.checkpoint.max_restarts + 1

    def once(attempt: int, log_file: Path) -> int:
        log.info(
            "attempt %d/%d: %d ranks (tp=%d pp=%d dp=%d), from step %d",
            attempt,
            attempts,
            world,
            r.parallel.tp,
            r.parallel.pp,
            r.parallel.dp,
            folder.latest_step() or 0,
        )
        progress = TrainProgress(folder.metrics, r.train.steps, log.info, every_s=PROGRESS_EVERY_S)
        rc = task(masks_exceptions(run_job), name=f"ranks-attempt-{attempt}", cache_policy=NONE, persist_result=False)(
            launch_command(recipe_file, data, str(folder.root), world, r.launch), log_file, env, poll=progress
        )
        progress()  # the last steps, if the job ended between two polls
        return rc

    def failed(rc: int, log_file: Path) -> None:
        tail = log_file.read_text(errors="replace").splitlines()[-15:]
        log.warning(
            "the job failed (exit %s) at step %d; last lines:\n%s", rc, folder.latest_step() or 0, "\n".join(tail)
        )

    return restarted(
        once,
        attempts,
        logs,
        failed,
        f"training failed {attempts} times (checkpoint.max_restarts={r.checkpoint.max_restarts}); see {logs}",
    )


@flow(name="train", persist_result=False)
@masks_exceptions
@owns(lambda recipe, data, out, local: out, "flow train")
def train(recipe: recipe_of(TrainRecipe), data: Location, out: Location, local: InProcess | None = None) -> TrainResult:
    """Train (or resume) the recipe on prepared data; restarts from ``latest`` after a failure
    (``local``: flows/run/params.py, the real recipe from a caller in this process)."""
    log = get_run_logger()
    checked = entered(recipe, data, local)
    run = Path(out).resolve()
    with owned_mirror(checked.recipe, log.warning):
        return _train(checked.recipe, data, run, checked.reference, log)


def entered(recipe: dict[str, Any], data: str, local: InProcess | None) -> Checked:
    """The recipe the flow runs on, checked once: as its caller checked it (the CLI, the
    pipeline's train stage: ``local.checked``), else checked here (a deployment run, a direct call)."""
    params = unmasked(recipe, local)  # refuses an InProcess of other parameters
    if local is not None and isinstance(local.checked, Checked):
        return local.checked
    r = from_dict(TrainRecipe, params)
    r.resolve_paths(Path.cwd())
    return check(r, data)


@contextlib.contextmanager
def owned_mirror(r: TrainRecipe, say: Callable[[str], None]) -> Iterator[None]:
    """The lease on ``checkpoint.mirror`` held for the block (one run writes a mirror:
    training/checkpoint/mirror.py); FolderInUse naming the run that holds it."""
    if not r.checkpoint.mirror:
        yield
        return
    with acquire(r.checkpoint.mirror, "flow train (checkpoint.mirror)", say=say):
        yield


def _train(r: TrainRecipe, data: str, run: Path, reference: Any, log: Any) -> TrainResult:
    folder = open_run(r, run, reference, log)
    recipe_file = ranks_recipe(r, folder)
    # One log folder per invocation, so an old run's last lines are never taken for this one's.
    runs = sorted(folder.logs.glob("run-*")) if folder.logs.exists() else []
    logs = folder.logs / f"run-{len(runs) + 1:03d}"
    env = job_env(r, logs)
    before_ranks(r, run, data, logs, env, log)
    watcher = start_watcher(run, r, data, logs / "evaluation.log", env) if r.evaluation.enabled else None
    if watcher:
        log.info(
            "evaluating each checkpoint in a separate process (pid %d, log %s)", watcher.pid, logs / "evaluation.log"
        )
    mirror = MirrorUploader(folder, r.checkpoint.mirror, r.checkpoint.keep, log.info) if r.checkpoint.mirror else None
    try:
        tries = run_ranks(r, folder, data, recipe_file, logs, env, log)
        if mirror:
            mirror.close()  # the last checkpoint on the mirror before the run reports done
    except BaseException:
        if mirror:
            mirror.stop()
        if watcher:  # a failed run: no waiting for evaluations
            stop_watcher(watcher, run, r, log, drain_s=0, why="training stopped with an error before it was evaluated")
        raise
    finally:
        (logs / "launch.env").unlink(missing_ok=True)  # the real NCCL settings of several nodes (launch_env)
        if recipe_file != folder.recipe:
            recipe_file.unlink(missing_ok=True)
    evaluation = stop_watcher(watcher, run, r, log) if watcher else None
    step = folder.latest_step() or 0
    records = read_metrics(folder.metrics)[0]
    return {
        "step": step,
        "steps": r.train.steps,
        "last": records[-1] if records else {},
        "attempts": tries,
        "stopped_by_kill_switch": folder.stop.exists() and step < r.train.steps,
        "evaluation": evaluation,
    }
