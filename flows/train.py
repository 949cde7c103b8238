"""The Prefect flow ``train``: validate, launch the ranks with the DeepSpeed launcher, restart
from the latest checkpoint when a rank dies.

The job runs as a subprocess in its own session (``start_new_session``) so that on failure or
cancellation its whole process group — launcher and every rank — is killed: a Prefect timeout
or cancel would not kill children by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bloomline.config import from_dict, to_dict
from bloomline.errors import BloomlineError, ConfigError
from bloomline.io import sha256_file, write_json_atomic
from training.config import TrainRecipe
from training.launch import launch_command, run_job

EXIT_USER_ERROR = 2  # training/main.py: a configuration or data problem, restarting cannot help


def validate(recipe: TrainRecipe, data_dir: str | Path) -> dict[str, Any]:
    """Everything that can be checked before any rank starts; raises with a message naming it."""
    from data_prep.shards import load_manifest

    if isinstance(recipe.model, str):
        raise ConfigError("model", f"unresolved model recipe '{recipe.model}'")
    recipe.parallel.check_model(recipe.model)
    if recipe.train.precision == "fp16" and not recipe.train.cpu_fp16:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("train.precision", "fp16 needs GPUs: DeepSpeed's CPU accelerator has no fp16 support on "
                                                 "this CPU; use bf16 (BLOOM's choice) or fp32 here, or "
                                                 "-o train.cpu_fp16=true to run fp16 slowly with torch's reference kernels")
    if recipe.train.precision == "fp32" and recipe.parallel.zero_stage == 0:
        raise ConfigError("parallel.zero_stage", "fp32 with zero_stage 0 cannot skip a NaN/inf batch (DeepSpeed's "
                                                 "plain optimizer path has no overflow check); use zero_stage >= 1 or bf16")
    m = load_manifest(data_dir)
    vocab = m["tokenizer"]["vocab_size"]
    if vocab != recipe.model.vocab_size:
        raise ConfigError("model.vocab_size", f"the model's vocabulary is {recipe.model.vocab_size} but the data in "
                                              f"{data_dir} was tokenized with a {vocab}-piece tokenizer")
    if max(m["buckets"]) > recipe.model.seq_len:
        raise ConfigError("model.seq_len", f"the data's largest bucket is {max(m['buckets'])} tokens, longer than the "
                                           f"model's seq_len {recipe.model.seq_len}")
    if not any(s["split"] == "train" for s in m["shards"]):
        raise BloomlineError(f"{data_dir} has no training shards")
    return m


def reshard_if_needed(run: Path, recipe: TrainRecipe, data: str | Path, log_file: Path) -> str | None:
    """When ``latest`` was written with another TP/PP/DP/ZeRO layout than the recipe's, lay it out
    for the recipe's (training/reshard.py) so the ranks can resume from it. Runs the converter
    as a subprocess: it loads whole tensors, and its memory is returned when it ends."""
    from training.reshard import check_convertible, is_ready, layout_of, reshard_command

    latest = run / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    step_dir = run / "checkpoints" / latest.read_text().strip()
    meta = json.loads((step_dir / "bloomline.json").read_text())
    saved, now = layout_of(meta["config"]["parallel"]), layout_of(recipe.parallel)
    if saved == now or is_ready(step_dir, now):
        return None
    if meta["data_manifest_sha256"] != sha256_file(Path(data) / "manifest.json"):
        return None  # the trainer refuses it with its message; no conversion for nothing
    try:
        check_convertible(step_dir, meta, now)
    except ValueError as e:
        raise BloomlineError(str(e)) from None
    cmd = reshard_command(step_dir, now)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}).returncode
    if rc != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise BloomlineError(f"converting {step_dir} to the layout {now} failed (see {log_file}):\n" + "\n".join(tail))
    return f"{step_dir.name}: {saved} -> {now}"


def _latest_step(out: Path) -> int:
    latest = out / "checkpoints" / "latest"
    return int(latest.read_text().strip()[5:]) if latest.is_file() else 0


@flow(name="train", persist_result=False)
def train(recipe: dict[str, Any], data: str, out: str) -> dict[str, Any]:
    """Train (or resume) the recipe on prepared data; restarts from ``latest`` after a failure."""
    log = get_run_logger()
    r = from_dict(TrainRecipe, recipe)
    r.resolve_paths(Path.cwd())
    validate(r, data)
    run = Path(out).resolve()
    run.mkdir(parents=True, exist_ok=True)
    recipe_file = run / "recipe.json"
    write_json_atomic(recipe_file, to_dict(r))
    env = dict(os.environ)
    try:
        import torch

        if not torch.cuda.is_available():
            env.setdefault("DS_ACCELERATOR", "cpu")
    except ImportError:
        pass
    world = r.parallel.world_size
    attempts = r.checkpoint.max_restarts + 1
    # One log folder per invocation, so an old run's last lines are never taken for this one's.
    runs = sorted((run / "logs").glob("run-*")) if (run / "logs").exists() else []
    logs = run / "logs" / f"run-{len(runs) + 1:03d}"
    converted = task(reshard_if_needed, name="reshard-checkpoint", cache_policy=NONE, persist_result=False)(
        run, r, data, logs / "reshard.log")
    if converted:
        log.info("checkpoint laid out for the new layout (universal checkpoint): %s", converted)
    for attempt in range(attempts):
        start = _latest_step(run)
        log.info("attempt %d/%d: %d ranks (tp=%d pp=%d dp=%d), from step %d", attempt + 1, attempts, world,
                 r.parallel.tp, r.parallel.pp, r.parallel.dp, start)
        rc = task(run_job, name=f"ranks-attempt-{attempt + 1}", cache_policy=NONE, persist_result=False)(
            launch_command(recipe_file, data, str(run), world), logs / f"attempt-{attempt + 1}.log", env)
        if rc == 0:
            break
        tail = (logs / f"attempt-{attempt + 1}.log").read_text(errors="replace").splitlines()[-15:]
        if rc == EXIT_USER_ERROR or any(line.startswith("error: ") for line in tail):
            msg = next((l for l in tail if l.startswith("error: ")), f"exit status {rc}")
            raise BloomlineError(f"training stopped: {msg.removeprefix('error: ')}")
        log.warning("the job failed (exit %s) at step %d; last lines:\n%s", rc, _latest_step(run), "\n".join(tail))
        if attempt + 1 == attempts:
            raise BloomlineError(f"training failed {attempts} times (checkpoint.max_restarts={r.checkpoint.max_restarts}); "
                                 f"see {logs}")
        time.sleep(1)
    step = _latest_step(run)
    metrics = run / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-1]) if metrics.exists() and metrics.stat().st_size else {}
    stopped = (run / "STOP").exists() and step < r.train.steps
    return {"step": step, "steps": r.train.steps, "last": last, "attempts": attempt + 1, "stopped_by_kill_switch": stopped}
