"""One checkpoint's evaluation, run and published: :func:`evaluate` runs it in this process
(eval/evaluate.py) or on ``parallel``'s tp·pp ranks (eval/parallel/), the one place that chooses;
:func:`run_evaluation` then publishes it into its run: the results table (contract 3,
eval/RESULTS.md), the per-language feedback an online mixture reads, TensorBoard scalars under
BLOOM's names, the refreshed dashboard, and the languages that regressed since the previous
evaluation. The ``evaluate`` flow (flows/stages/evaluate.py) runs this and adds its Prefect
artifacts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, TypedDict

import pyarrow as pa
import torch

from bloomline.errors import ConfigError
from bloomline.storage import is_url
from data_prep.storage.data_cache import prepared
from eval.evaluate import Evaluation, checked, evaluate_with, precision_of
from eval.model import LocalModel, TransformersModel, resolve_device
from eval.parallel.launch import evaluate_on_ranks
from eval.published import PUBLISHED, load_whole, other_model
from eval.results.metrics import regressions
from eval.results.rows import VALIDATION, ResultRow, ValidationRow, is_language, of_languages, validation_rows
from eval.results.table import SCHEMA, forget_after, read_results, write_results
from training.checkpoint.meta import PRECISIONS
from training.checkpoint.run_dir import RunDir
from training.config import EvalConfig
from training.data.mixture.online import write_feedback
from training.data.shard_reader import ShardIndex


def previous_rows(run_dir: Path, step: int) -> dict[str, dict[str, Any]]:
    """The validation task's language rows of the latest evaluation before ``step``, by language."""
    t = validation_rows(read_results(run_dir))
    earlier = [r["step"] for r in t if r["step"] < step]
    if not earlier:
        return {}
    last = max(earlier)
    return {r["lang"]: r for r in t if r["step"] == last and is_language(r)}


def write_tensorboard(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Scalars at the checkpoint's step, in the run's TensorBoard folder: the validation task's per
    language and aggregate under BLOOM's names (``lm-loss-validation/<set>/lm loss validation``)
    plus bits per byte; every other task's as ``eval/<task>/<lang>/<metric>``."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(RunDir(run_dir).tensorboard), filename_suffix=".eval")
    for r in rows:
        if r["task"] != VALIDATION and r["value"] is not None and math.isfinite(r["value"]):
            name = r["lang"] if is_language(r) else f"{r['lang']}-{r['weighting']}"
            w.add_scalar(f"eval/{r['task']}/{name}/{r['metric']}", r["value"], r["step"])
    for r in validation_rows(pa.Table.from_pylist(rows, schema=SCHEMA)):
        name = r["lang"] if is_language(r) else f"{r['lang']}-{'tokens' if r['weighting'] == 'tokens' else 'mean'}"
        for tag, v in (
            (f"lm-loss-validation/{name}/lm loss validation", r["loss"]),
            (f"lm-loss-validation/{name}/lm loss validation ppl", r["ppl"]),
            (f"bits-per-byte-validation/{name}/bits per byte", r["bpb"]),
        ):
            if math.isfinite(v):
                w.add_scalar(tag, v, r["step"])
    w.close()


def retract_after(run_dir: str | Path, step: int) -> list[int]:
    """Withdraw what was published for the checkpoints after ``step`` (results, generations, skipped
    records, the mixture's feedback files), as a run that resumes from ``step`` replaces those
    checkpoints: they are evaluated again, once, when the run writes them anew. Their TensorBoard
    scalars go with the purge at the resumed step (training/loop/metrics_log.py, ``purge_step``); the
    steps withdrawn."""
    from training.data.mixture.online import drop_feedback_after

    return sorted(set(forget_after(run_dir, step)) | set(drop_feedback_after(RunDir(Path(run_dir)), step)))


class Published(TypedDict):
    """What one checkpoint's evaluation hands the flow that ran it (flows/stages/evaluate.py, the CLI)."""

    run: str
    """The name of the run folder the results went to."""
    step: int
    results: str
    """The results file written (contract 3)."""
    dashboard: str
    rows: list[ValidationRow]
    """The validation task's rows, wide."""
    task_rows: list[ResultRow]
    """Every task's rows, long (the results file's)."""
    generations: list[dict[str, Any]]
    regressions: list[dict[str, Any]]
    """Languages whose bits per byte rose past the threshold since the previous evaluation."""
    previous: dict[str, ValidationRow]
    seconds: float
    tokens: int
    task_seconds: dict[str, float]


def evaluate(
    ckpt_dir: str | Path,
    data_dir: str | Path,
    cfg: EvalConfig,
    run: str,
    stamp: Optional[Path] = None,
    progress: Callable[[str], None] = lambda msg: None,
    logs: Optional[Path] = None,
    meta: Optional[dict[str, Any]] = None,
) -> Evaluation:
    """Evaluate the checkpoint ``ckpt_dir`` (or a published model's folder: eval/published.py) on
    ``data_dir``'s validation splits and ``cfg.tasks``: in this process, or on ``cfg.parallel``'s
    tp·pp ranks (eval/parallel/), whose log goes to ``logs`` (default: the checkpoint's run's).
    Everything a user can get wrong is refused here, in one line, before a model is loaded or a
    rank started (``meta``: what :func:`eval.evaluate.checked` returned, where the caller checked
    already)."""
    ckpt_dir, url = Path(ckpt_dir), data_dir
    data_dir = prepared(data_dir)  # data at a URL: this node's cache of it
    meta = checked(ckpt_dir, data_dir, cfg) if meta is None else meta
    if cfg.parallel.world_size > 1:
        if is_url(str(url)):  # the ranks read the validation shards from the cache: fetched here first
            ShardIndex(data_dir, "valid").fetch_all()
        logs = logs or RunDir.of_checkpoint(ckpt_dir).logs
        got = evaluate_on_ranks(ckpt_dir, data_dir, cfg, run, meta, logs, stamp, progress)
        return Evaluation(got["rows"], got["generations"], got["seconds"], got["tokens"], got["task_seconds"])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    whole = load_whole(ckpt_dir, meta, data_dir, PRECISIONS[precision_of(cfg, device)])
    other = other_model(meta)
    model = TransformersModel(whole, other, device) if other else LocalModel(whole, device)
    return evaluate_with(model, meta, ckpt_dir, data_dir, cfg, run, stamp, progress)


def run_evaluation(
    ckpt_dir: str | Path,
    data_dir: str | Path,
    cfg: EvalConfig,
    out: str | Path | None = None,
    progress: Callable[[str], None] = lambda msg: None,
    meta: Optional[dict[str, Any]] = None,
) -> Published:
    """Evaluate one checkpoint (or published model folder) and publish its results into ``out``
    (default: the checkpoint's run), the log of a parallel evaluation in its ``logs/`` (``meta``:
    as :func:`evaluate` takes it)."""
    ckpt_dir = Path(ckpt_dir)
    run_dir = Path(out).resolve() if out else RunDir.of_checkpoint(ckpt_dir).root
    if cfg.heldout and run_dir == RunDir.of_checkpoint(ckpt_dir).root.resolve():
        # the run's own results, and what its mixture steers by, are of its validation split
        raise ConfigError("heldout", "results on held-out data go to a folder of their own: give --out")
    ev = evaluate(
        ckpt_dir,
        data_dir,
        cfg,
        run=run_dir.name,
        stamp=RunDir(run_dir).eval_stamp,
        progress=progress,
        logs=RunDir(run_dir).logs,
        meta=meta,
    )
    step = ev.rows[0]["step"]
    before = previous_rows(run_dir, step)
    path = write_results(run_dir, step, ev.rows, ev.generations)
    val = validation_rows(pa.Table.from_pylist(ev.rows, schema=SCHEMA))
    langs = of_languages(val)
    # what an online mixture steered by evaluations reads (training/data/mixture/online.py); a
    # published model's evaluation steers no run
    if ev.rows[0]["layout"] != PUBLISHED:
        continuation = {  # the continuation task's accuracy and items per language it scored (batch.online.signal)
            r["lang"]: (r["value"], r["n"])
            for r in ev.rows
            if r["task"] == "continuation"
            and r["scope"] == "language"
            and r["metric"] == "acc"
            and r["value"] is not None
        }
        write_feedback(
            run_dir,
            step,
            {r["lang"]: r["bpb"] for r in langs},
            {r["lang"]: r["tokens_seen"] for r in langs},
            continuation,
        )
    write_tensorboard(run_dir, ev.rows)
    from eval.pages.dashboard import build  # the dashboard reads the results table this module writes

    dashboard = build(run_dir, cfg.regression_threshold)  # every evaluation refreshes it
    return {
        "run": run_dir.name,
        "step": step,
        "results": str(path),
        "dashboard": str(dashboard),
        "rows": val,
        "task_rows": ev.rows,
        "generations": ev.generations,
        "regressions": regressions(val, before, cfg.regression_threshold),
        "previous": before,
        "seconds": ev.seconds,
        "tokens": ev.tokens,
        "task_seconds": ev.task_seconds,
    }
