"""The Prefect flow ``pipeline``, the main job: prepare → train (every checkpoint evaluated while
training runs) → evaluation of what is left → dashboard → Hugging Face export of the final checkpoint.

Each stage runs as its own flow (``prepare``, ``train``, ``evaluate``) or task, nested in this one,
so the Prefect UI shows one timeline. A stage is skipped when a complete output for its key
exists (flows/stages/reuse.py): a rerun reuses what is done, says which stages it reused and why the
others run, and after a failure starts again at the stage that failed (which itself resumes: the
data preparation from its finished chunks, training from its latest checkpoint).

RUN_DIR layout::

    pipeline.json                 what the last run did: each pass's key, folder, reused or why it ran
    prepare/<key>/                prepared data (contract 1: manifest.json, shards/, tokenizer/)
    train/<key>/                  the training run (contract 2: checkpoints/, metrics.jsonl, tensorboard/)
        eval/                     its evaluations (contract 3), dashboard/index.html
    evaluate/<key>/eval/          a copy of those evaluations, one folder per evaluation settings:
                                  switching the settings back restores them instead of evaluating again
    export/<key>/                 the final checkpoint as a Hugging Face BloomForCausalLM
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bloomline.config import Location, recipe_of, to_dict
from bloomline.errors import BloomlineError
from bloomline.io import read_json, write_json_atomic
from bloomline.secrets import mask_tree, masks_exceptions
from bloomline.storage import content_digest
from data_prep.config import PrepareConfig
from data_prep.storage.shards import manifest_path, manifest_sha256
from eval.results.table import clear_evaluations, copy_evaluations, results_dir
from eval.tasks import data_digest
from flows.config import PipelineConfig
from flows.run.params import InProcess, flow_args, typed
from flows.run.runlock import owns
from flows.stages.reuse import StageKey, code_digest, completed, mark_complete, why_rerun
from training.checkpoint.load import weights_digest
from training.checkpoint.meta import read_meta
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe

if TYPE_CHECKING:
    from flows.display.progress import ProgressBars

RECORD = "pipeline.json"
Log = Union[logging.Logger, logging.LoggerAdapter]
"""Where the stages say what they do: the flow run's logger (Prefect's adapter), or any logger."""


class StageError(BloomlineError):
    """A stage failed; the message leads with the stage's name and its own error."""

    def __init__(self, stage: str, error: BaseException):
        self.stage = stage
        super().__init__(f"stage '{stage}' failed: {error}")


def prepare_key(cfg: PrepareConfig) -> StageKey:
    """Data: :meth:`PrepareConfig.identity` (the settings and the bytes of every input) and the code."""
    ident = cfg.identity()
    return StageKey("prepare", {"inputs": ident["inputs"], "code": code_digest("prepare")}, ident["config"])


def train_key(recipe: TrainRecipe, data_dir: Path) -> StageKey:
    """Training: the recipe (less the evaluation, its own stage, and where the ranks run) and the
    prepared data's manifest, which holds every shard's sha256: a content hash of the whole dataset.
    A mixture steered by evaluations (``batch.online.rule: evaluation``) makes the evaluation's
    settings and code shape the weights: then they are in this key too."""
    c = to_dict(recipe)
    c.pop("launch", None)
    parts = {"data": manifest_sha256(data_dir), "code": code_digest("train")}
    if recipe.batch.mixture == "online" and recipe.batch.online.rule == "evaluation":
        parts["evaluation_code"] = code_digest("evaluate")
        parts["task_data"] = data_digest(recipe.evaluation.settings.tasks)
        if recipe.batch.online.reference:  # the reference run's results steer the weights too
            parts["reference"] = content_digest([results_dir(recipe.batch.online.reference)])[0]
    else:
        c.pop("evaluation", None)
    return StageKey("train", parts, c)


def evaluate_key(recipe: TrainRecipe, train: StageKey) -> StageKey:
    settings = recipe.evaluation.settings
    return StageKey(
        "evaluate",
        {"train": train.key, "code": code_digest("evaluate"), "task_data": data_digest(settings.tasks)},
        to_dict(settings),
    )


def export_key(cfg: PipelineConfig, ckpt: Path) -> StageKey:
    return StageKey("export", {"checkpoint": weights_digest(ckpt), "code": code_digest("export")}, to_dict(cfg.export))


class Stages:
    """Runs or reuses each stage and keeps the record (``RUN_DIR/pipeline.json``)."""

    def __init__(self, run: Path, log: Log):
        self.run, self.log = run, log
        previous = read_json(run / RECORD) if (run / RECORD).is_file() else {}
        self.previous: dict[str, Any] = previous.get("stages", {})
        self.record: dict[str, Any] = {}

    def run_stage(
        self,
        key: StageKey,
        folder: Path,
        body: Callable[[], dict[str, Any]],
        intact: Callable[[dict[str, Any]], str | None] = lambda outputs: None,
    ) -> tuple[dict[str, Any], bool]:
        """(outputs, reused): ``body()`` runs unless ``folder`` holds a complete output for ``key``
        that ``intact(outputs)`` finds whole (it returns what is wrong, or None); ``body`` returns
        the outputs to record, or raises. Its errors are re-raised as StageError."""
        name = key.stage
        done = completed(folder, key)
        damage = intact(done["outputs"]) if done is not None else None
        t0 = time.monotonic()
        if done is not None and damage is None:
            why = f"same config, inputs and code as the run that made it ({done.get('finished', '?')})"
            self.log.info("%s: reused %s — %s", name, folder, why)
            outputs, reused = done["outputs"], True
        else:
            why = (
                f"its output changed since it was made: {damage}" if damage else why_rerun(key, self.previous.get(name))
            )
            self.log.info("%s: running (%s) → %s", name, why, folder)
            try:
                outputs = body()
            except StageError:
                raise
            except BloomlineError as e:
                raise StageError(name, e) from None
            mark_complete(folder, key, outputs)
            reused = False
        self.record[name] = {
            "key": key.key,
            "folder": str(folder),
            "reused": reused,
            "why": why,
            "parts": key.parts,
            "config": mask_tree(key.config),
            "outputs": outputs,
            "seconds": round(time.monotonic() - t0, 1),
        }
        write_json_atomic(self.run / RECORD, {"stages": {**self.previous, **self.record}})
        return outputs, reused


def export_broken(export_dir: Path) -> str | None:
    """Why a reused export cannot serve (its weights gone, or transformers cannot read its config), or None."""
    from training.hf.to_hf import check_export

    if not (export_dir / "model.safetensors").is_file():
        return "model.safetensors is missing"
    try:
        check_export(export_dir)
    except Exception as e:  # whatever transformers raises for a file it cannot read
        return f"transformers cannot load it ({type(e).__name__})"
    return None


def evaluations_of(folder: RunDir, key: StageKey, restore_from: Path | None = None) -> bool:
    """Make the run's eval/ (what its dashboard reads) hold the evaluations of ``key``'s settings
    only: when it holds another key's, or nobody knows whose, it is unmarked, then cleared (or made a
    copy of ``restore_from``, a kept set), then marked with ``key`` (``folder.evaluated_with``) —
    so a kill midway leaves it unknown, never mislabelled. Whether it had to."""
    try:
        if read_json(folder.evaluated_with)["key"] == key.key:
            return False
    except (OSError, ValueError, KeyError, TypeError):
        pass
    folder.evaluated_with.unlink(missing_ok=True)
    if restore_from is None:
        clear_evaluations(folder.root)
    else:
        copy_evaluations(restore_from, folder.root)
    write_json_atomic(folder.evaluated_with, {"key": key.key, "settings": mask_tree(key.config)})
    return True


@flow(name="pipeline", persist_result=False)
@masks_exceptions
@owns(lambda config, out, local: out, "flow pipeline")
def pipeline(config: recipe_of(PipelineConfig), out: Location, local: InProcess | None = None) -> dict[str, Any]:
    """The main job (see the module docstring); returns the record of every stage and where the
    outputs are (``local``: flows/run/params.py, the real config and the prepare stage's progress
    display from a caller in this process)."""
    log = get_run_logger()
    cfg = typed(PipelineConfig, config, local)
    progress = local.progress if local is not None else None
    run = Path(out).resolve()
    run.mkdir(parents=True, exist_ok=True)
    stages = Stages(run, log)
    data_dir = data_stage(cfg.data, stages, progress)
    trained = train_stage(cfg.train, data_dir, stages)
    dashboard = evaluate_stage(cfg.train, data_dir, trained, stages)
    folder = trained.folder
    result: dict[str, Any] = {
        "run": str(run),
        "data": str(data_dir),
        "train": str(folder.root),
        "dashboard": str(dashboard),
        "tensorboard": str(folder.tensorboard),
        "checkpoints": str(folder.checkpoints),
    }
    if cfg.export.enabled:
        result["export"] = str(export_stage(cfg, folder, data_dir, stages))
    result["stages"] = stages.record
    write_json_atomic(run / RECORD, {"stages": {**stages.previous, **stages.record}, "outputs": result})
    return result


def data_stage(cfg: PrepareConfig, stages: Stages, progress: ProgressBars | None = None) -> Path:
    """1. The prepared data (``bloomline prepare``), checked against contract 1 even when reused."""
    from data_prep.storage.shards import load_manifest
    from flows.stages.prepare import prepare

    key = prepare_key(cfg)
    data_dir = key.folder(stages.run)

    def do_prepare() -> dict[str, Any]:
        sent, local = flow_args(to_dict(cfg), progress, checked=cfg)
        m = prepare(sent, str(data_dir), local=local)
        return {
            "data": str(data_dir),
            "manifest_sha256": manifest_sha256(data_dir),
            "languages": len(m.get("languages", {})),
            "train_tokens": m.get("totals", {}).get("train_tokens"),
        }

    def data_intact(outputs: dict[str, Any]) -> str | None:
        manifest = manifest_path(data_dir)
        if not manifest.is_file() or manifest_sha256(data_dir) != outputs["manifest_sha256"]:
            return f"{manifest} is missing or was rewritten"
        return None

    stages.run_stage(key, data_dir, do_prepare, data_intact)
    load_manifest(data_dir)
    return data_dir


@dataclass(frozen=True)
class Trained:
    """What the training stage hands on."""

    folder: RunDir
    """The training run (contract 2)."""
    evaluation: StageKey
    """The key of its evaluation settings: the watcher evaluated with them, the evaluation stage
    finishes with them."""


def train_stage(recipe: TrainRecipe, data_dir: Path, stages: Stages) -> Trained:
    """2. Training, each checkpoint evaluated alongside by the train flow's watcher with the
    evaluation settings of the key it returns. The model's values left to the data are filled
    first (they are part of the key)."""
    from flows.stages.train import train
    from flows.stages.train_job import check, fit_model_to_data

    for line in fit_model_to_data(recipe, data_dir):
        stages.log.info(f"train: {line}")
    key = train_key(recipe, data_dir)
    folder = RunDir(key.folder(stages.run))
    evaluation = evaluate_key(recipe, key)

    def do_train() -> dict[str, Any]:
        checked = check(recipe, data_dir)
        evaluations_of(folder, evaluation)  # the watcher evaluates with this recipe's settings: no mixing with others
        sent, local = flow_args(to_dict(recipe), checked=checked)
        res = train(sent, str(data_dir), str(folder.root), local=local)
        if res["stopped_by_kill_switch"]:
            raise BloomlineError(
                f"stopped by the kill switch at step {res['step']}/{res['steps']}: remove "
                f"{folder.root / 'STOP'} and rerun to continue"
            )
        return {
            "run": str(folder.root),
            "step": res["step"],
            "loss": res["last"].get("loss"),
            "attempts": res["attempts"],
        }

    def train_intact(outputs: dict[str, Any]) -> str | None:
        step = folder.latest_step()
        return None if step == outputs["step"] else f"its latest checkpoint is step {step}, not {outputs['step']}"

    stages.run_stage(key, folder.root, do_train, train_intact)
    return Trained(folder, evaluation)


def evaluate_stage(recipe: TrainRecipe, data_dir: Path, trained: Trained, stages: Stages) -> Path:
    """3. Evaluation of every kept checkpoint not evaluated yet with these settings, then the
    dashboard (its path). The stage's own folder keeps a copy of the run's evaluations per
    settings, so switching a value back restores them rather than evaluating again; the run's
    eval/ (what the dashboard reads) always holds the evaluations of the current settings."""
    from eval.pages.dashboard import build
    from eval.results.table import evaluated_steps, skipped_steps
    from flows.stages.evaluate import evaluate_flow

    folder, key = trained.folder, trained.evaluation
    train_dir, kept = folder.root, key.folder(stages.run)

    def do_evaluate() -> dict[str, Any]:
        evaluations_of(folder, key)  # made with other settings, or unknown: evaluate every checkpoint
        todo = [s for s in folder.complete_steps() if s not in evaluated_steps(train_dir)]
        settings, local = flow_args(to_dict(recipe.evaluation.settings))
        for step in todo:
            evaluate_flow(str(folder.step_dir(step)), str(data_dir), settings, str(train_dir), local=local)
        copy_evaluations(train_dir, kept)
        return {
            "evaluated": evaluated_steps(train_dir),
            "skipped": {str(k): v for k, v in skipped_steps(train_dir).items()},
            "evaluated_now": todo,
        }

    def kept_intact(outputs: dict[str, Any]) -> str | None:
        have = evaluated_steps(kept)
        return None if have == outputs["evaluated"] else f"it keeps results of steps {have}, not {outputs['evaluated']}"

    _, reused = stages.run_stage(key, kept, do_evaluate, kept_intact)
    if reused and evaluations_of(folder, key, restore_from=kept):  # the run's eval/ held other settings' results
        stages.log.info("evaluate: the run's evaluations restored from %s", kept)
    return task(masks_exceptions(build), name="dashboard", cache_policy=NONE, persist_result=False)(train_dir)


def export_stage(cfg: PipelineConfig, folder: RunDir, data_dir: Path, stages: Stages) -> Path:
    """4. The final checkpoint as a Hugging Face model."""
    from training.hf.to_hf import export

    final = folder.latest_dir()
    if final is None:
        raise StageError("export", BloomlineError(f"{folder.root} has no checkpoint to export"))
    key = export_key(cfg, final)
    export_dir = key.folder(stages.run)

    def do_export() -> dict[str, Any]:
        made = task(masks_exceptions(export), name="export-hf", cache_policy=NONE, persist_result=False)(
            final, export_dir, data_dir, cfg.export.dtype
        )
        return {"export": str(made), "step": read_meta(final)["step"]}

    stages.run_stage(key, export_dir, do_export, lambda outputs: export_broken(export_dir))
    return export_dir
