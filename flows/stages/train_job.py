"""The training job outside its flow: the checks made before any rank starts, the ranks'
recipe and environment, and the restarts of a job (on the first node by the flow ``train`` in
flows/stages/train.py, on another node by :func:`run_worker_node`).

Prefect-free on purpose: a node other than the first runs its ranks without Prefect, and
Prefect reads ``PREFECT_API_URL`` when it is first imported, so a module that imported it before
``bloomline train`` found or started its server (flows/run/api_server.py) made Prefect start a
temporary server of its own beside that one (measured: 5.6 s to a flow's first line, against 1 s).
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from bloomline.config import to_dict
from bloomline.disk import NEARLY_FULL_BYTES, disk_full_error, free_bytes
from bloomline.errors import BloomlineError, ConfigError
from bloomline.io import write_json_atomic
from bloomline.secrets import mask_tree
from data_prep.storage.shards import check_model_fits, load_manifest
from eval.results.reference import reference_curve
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe
from training.data.mixture.blend import run_blend
from training.data.mixture.controller import ReferenceCurve
from training.data.shard_reader import ShardIndex
from training.hf.from_hf import check_init_from
from training.loop.launch import EXIT_OK, EXIT_USER_ERROR, check_hostfile, launch_command, launch_env, run_job


@dataclass(frozen=True)
class Checked:
    """A training recipe checked against its data (:func:`check`), where it entered: the CLI or
    the pipeline's train stage hands it to the train flow, which then runs on it as it is."""

    recipe: TrainRecipe
    """The recipe, with the model's values left to the data filled in."""
    reference: Optional[tuple[ReferenceCurve, dict[str, Any]]]
    """An online mixture's reference run as checked (None without one)."""


def check(recipe: TrainRecipe, data_dir: str | Path) -> Checked:
    """``recipe`` checked against ``data_dir`` by :func:`validate`, before any rank starts."""
    return Checked(recipe, validate(recipe, data_dir))


def validate(recipe: TrainRecipe, data_dir: str | Path) -> Optional[tuple[ReferenceCurve, dict[str, Any]]]:
    """Everything that can be checked before any rank starts; raises with a message naming it.
    Returns an online mixture's reference run as checked (None without one), so the flow writes
    it for the ranks without reading the reference's results again."""
    if isinstance(recipe.model, str):
        raise ConfigError("model", f"unresolved model recipe '{recipe.model}'")
    import torch

    recipe.parallel.check_model(recipe.model)
    from eval.tasks import check

    check(recipe.evaluation.settings.tasks)  # an unknown task would fail every evaluation
    recipe.check_device(torch.cuda.is_available(), torch.__version__)
    check_hostfile(recipe.launch, recipe.parallel.world_size)
    m = load_manifest(data_dir)
    fit_model_to_data(recipe, data_dir)
    from eval.evaluate import check_eval_layout

    # a layout that cannot cut the model would fail every evaluation too
    check_eval_layout(recipe.evaluation.settings, recipe.model, "evaluation.settings.")
    check_model_fits(m, data_dir, recipe.model.vocab_size, recipe.model.seq_len)
    if recipe.train.init_from:  # the weights' shape is the recipe's, their embedding fits the data's tokenizer
        check_init_from(recipe.model, m["tokenizer"], recipe.train.init_from, Path(data_dir))
    if not any(s["split"] == "train" for s in m["shards"]):
        raise BloomlineError(f"{data_dir} has no training shards")
    weights = run_blend(recipe, ShardIndex(data_dir, "train")).weights_for(1)  # refuses a cap the data cannot meet
    reference = None
    if recipe.batch.mixture == "online":
        languages = sorted(k for k, v in weights.items() if v > 0)  # those the trainer samples and steers
        recipe.batch.online.check_languages(len(languages))
        if recipe.batch.online.reference:
            reference = reference_curve(recipe.batch.online.reference, data_dir, languages)
    return reference


def fit_model_to_data(recipe: TrainRecipe, data_dir: str | Path) -> list[str]:
    """The model's values left to the data, filled from ``data_dir``'s manifest
    (training/config/model.py ``ModelConfig.fit_to_data``); one line per value derived."""
    if isinstance(recipe.model, str):
        raise ConfigError("model", f"unresolved model recipe '{recipe.model}'")
    m = load_manifest(data_dir)
    return recipe.model.fit_to_data(int(m["tokenizer"]["vocab_size"]), max(int(b) for b in m["buckets"]))


def ranks_recipe(r: TrainRecipe, folder: RunDir) -> Path:
    """The recipe file the ranks read: the real values when it holds secrets and every rank runs
    on this node (a file only this user can read, outside the run folder, removed after the job);
    else the run's recipe.json. Ranks a launcher starts on other nodes read recipe.json, masked:
    none of the settings they use holds a secret (secret-named settings are the launcher's, NCCL_*)."""
    import tempfile

    real = to_dict(r)
    if mask_tree(real) == real or (r.launch.hostfile is not None and not r.launch.no_ssh):
        return folder.recipe
    fd, name = tempfile.mkstemp(prefix="bloomline-recipe-", suffix=".json")  # mode 0600
    with os.fdopen(fd, "w") as f:
        json.dump(real, f)
    return Path(name)


def job_env(recipe: TrainRecipe, logs: Path) -> dict[str, str]:
    """The launcher's environment: CPU accelerator where there is no GPU, the recipe's NCCL settings."""
    env = dict(os.environ)
    try:
        import torch

        if not torch.cuda.is_available():
            env.setdefault("DS_ACCELERATOR", "cpu")
    except ImportError:
        pass
    return launch_env(recipe.launch, env, logs / "launch.env")


def restarted(
    once: Callable[[int, Path], int], attempts: int, logs: Path, failed: Callable[[int, Path], None], gave_up: str
) -> int:
    """Run the job until it succeeds, at most ``attempts`` times; the attempts it took.
    ``once(attempt, log_file)`` runs attempt 1, 2, … (its log ``logs/attempt-N.log``) and returns
    the exit status. A user error (:data:`EXIT_USER_ERROR`: a configuration or data problem, which
    the same job would hit again) stops at once with the error line from its log; any other
    failure is reported by ``failed(status, log_file)`` and retried from the latest checkpoint,
    or, after the last attempt, raised as ``gave_up``."""
    for attempt in range(1, attempts + 1):
        log_file = logs / f"attempt-{attempt}.log"
        rc = once(attempt, log_file)
        if rc == EXIT_OK:
            return attempt
        if rc == EXIT_USER_ERROR:
            line = _error_line(log_file)
            if line is None and free_bytes(logs) < NEARLY_FULL_BYTES:  # the rank's line found no room in its log
                raise disk_full_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), logs.parent.parent)
            raise BloomlineError(f"training stopped: {line or f'exit status {rc}, see {log_file}'}")
        failed(rc, log_file)
        if attempt < attempts:
            time.sleep(1)
    raise BloomlineError(gave_up)


def run_worker_node(r: TrainRecipe, data: str | Path, out: str | Path, say: Any = print) -> int:
    """This node's ranks of a job whose first node runs the flow ``train``; restarted like the
    flow restarts its own (they meet again at the same master address and port). Prefect-free:
    the job's one flow run, its evaluations and its checkpoints belong to the first node."""
    validate(r, data)
    run = Path(out).resolve()
    folder = RunDir(run)
    run.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder.recipe, mask_tree(to_dict(r)))
    node = r.launch.node_rank
    logs = folder.logs / f"node-{node}"
    env = job_env(r, logs)
    attempts = r.checkpoint.max_restarts + 1
    recipe_file = ranks_recipe(r, folder)
    try:

        def once(attempt: int, log_file: Path) -> int:
            say(f"node {node}: attempt {attempt}/{attempts}, log {log_file}")
            return run_job(launch_command(recipe_file, data, run, r.parallel.world_size, r.launch), log_file, env)

        def failed(rc: int, log_file: Path) -> None:
            say(f"node {node}: the job failed (exit {rc}); rejoining from the latest checkpoint")

        return restarted(once, attempts, logs, failed, f"training failed {attempts} times on node {node}; see {logs}")
    finally:
        (logs / "launch.env").unlink(missing_ok=True)
        if recipe_file != folder.recipe:
            recipe_file.unlink(missing_ok=True)


def where_stopped(out: str | Path, steps: int) -> str:
    """Where a run in ``out`` stands, for the line of an interrupted ``bloomline train``:
    ``"at step 12/30 (a rerun resumes from its checkpoint step_10)"``."""
    from training.loop.metrics_log import read_metrics

    folder = RunDir(Path(out))
    rows = read_metrics(folder.metrics)[0]
    at = f"at step {rows[-1]['step']}/{steps}" if rows else "before the first step"
    latest = folder.latest_step()
    return f"{at} ({'a rerun resumes from checkpoint step_' + str(latest) if latest else 'no checkpoint yet'})"


def _error_line(log_file: Path) -> str | None:
    """The message a rank printed for a user error (``error: ...``), to stop with it."""
    lines = log_file.read_text(errors="replace").splitlines() if log_file.exists() else []
    return next((l.removeprefix("error: ") for l in reversed(lines) if l.startswith("error: ")), None)
