"""The Prefect flow ``evaluate``: one checkpoint, per language, into the run's results (contract 3),
its TensorBoard, and two Prefect artifacts.

eval/publish.py ``run_evaluation`` does the work (evaluate → publish → TensorBoard → regressions);
the flow adds the artifacts: a table (languages × metrics) and a markdown summary (best and worst
languages, the biggest changes since the previous checkpoint, the regressions).
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bloomline.config import Location, from_dict, recipe_of, to_dict
from bloomline.secrets import mask_text, mask_tree, masks_exceptions
from eval.publish import run_evaluation
from eval.results.rows import is_language, of_languages
from flows.run.params import InProcess, unmasked
from flows.run.runlock import owns
from training.checkpoint.run_dir import RunDir
from training.config import EvalConfig


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and hyphens): ``zh-Hans`` → ``zh-hans``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def summary_markdown(res: dict[str, Any], top: int = 5) -> str:
    langs = [r for r in of_languages(res["rows"]) if math.isfinite(r["bpb"])]
    by_bpb = sorted(langs, key=lambda r: r["bpb"])
    lines = [
        f"# Evaluation at step {res['step']}",
        "",
        f"{len(langs)} languages, {res['tokens']:,} tokens in {res['seconds']:.1f} s.",
        "",
    ]
    overall = next((r for r in res["rows"] if r["scope"] == "overall" and r["weighting"] == "tokens"), None)
    if overall:
        lines += [f"Overall bits per byte {overall['bpb']:.4f} (token-weighted), loss {overall['loss']:.4f}.", ""]
    lines += [
        "## Best (lowest bits per byte)",
        *[f"- {r['lang']}: {r['bpb']:.4f}" for r in by_bpb[:top]],
        "",
        "## Worst",
        *[f"- {r['lang']}: {r['bpb']:.4f}" for r in by_bpb[::-1][:top]],
        "",
    ]
    prev = res["previous"]
    if prev:
        changes = sorted(
            ((r["bpb"] - prev[r["lang"]]["bpb"], r["lang"]) for r in langs if r["lang"] in prev),
            key=lambda c: -abs(c[0]),
        )
        lines += [
            f"## Biggest changes since step {next(iter(prev.values()))['step']}",
            *[f"- {lang}: {d:+.4f}" for d, lang in changes[:top]],
            "",
        ]
    tasks = [r for r in res["task_rows"] if r["task"] != "validation" and r["scope"] == "overall"]
    if tasks:
        lines += [
            "## Tasks (mean of languages)",
            *[f"- {r['task']} {r['metric']}: {r['value']:.4f} ({r['n']} languages)" for r in tasks],
            "",
        ]
    skips = [r for r in res["task_rows"] if r["metric"] == "skipped"]
    if skips:
        lines += ["## Not evaluated", *[f"- {r['task']} {r['lang']}: {r['note']}" for r in skips], ""]
    regs = res["regressions"]
    lines += [
        "## Regressions",
        *(
            [
                f"- **{g['lang']}**: bits per byte {g['previous_bpb']:.4f} → {g['bpb']:.4f} ({g['change']:+.1%})"
                for g in regs
            ]
            or ["none"]
        ),
    ]
    return "\n".join(lines)


@flow(name="evaluate", persist_result=False)
@masks_exceptions
@owns(lambda checkpoint, data, config, out, local: out or RunDir.of_checkpoint(checkpoint).root, "flow evaluate")
def evaluate_flow(
    checkpoint: Location,
    data: Location,
    config: recipe_of(EvalConfig),
    out: Optional[Location] = None,
    local: InProcess | None = None,
) -> dict[str, Any]:
    """Evaluate one checkpoint per language; results, TensorBoard scalars and two artifacts
    (``local``: flows/run/params.py, the real settings from a caller in this process)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    log = get_run_logger()
    cfg = from_dict(EvalConfig, unmasked(config, local))
    meta = local.checked if local is not None else None  # the checkpoint's record, where the caller checked it
    res = task(masks_exceptions(run_evaluation), name="evaluate-checkpoint", cache_policy=NONE, persist_result=False)(
        checkpoint, data, cfg, out, progress=log.info, meta=meta
    )
    run = res["run"]
    cols = ("lang", "family", "loss", "ppl", "bpb", "tokens", "bytes", "docs", "tokens_seen")
    table = [
        {k: (round(r[k], 6) if isinstance(r[k], float) else r[k]) for k in cols} for r in res["rows"] if is_language(r)
    ]
    create_table_artifact(mask_tree(table), key=artifact_key("evaluation", run), description=f"step {res['step']}")
    tasks = [
        {
            k: (round(r[k], 6) if isinstance(r[k], float) else r[k])
            for k in ("task", "lang", "metric", "value", "stderr", "n", "note")
        }
        for r in res["task_rows"]
        if r["task"] != "validation" and is_language(r)
    ]
    if tasks:
        create_table_artifact(
            mask_tree(tasks),
            key=artifact_key("evaluation-tasks", run),
            description=f"step {res['step']}: each task's metrics per language",
        )
    for name, s in res["task_seconds"].items():
        log.info("task %s: %.1f s", name, s)
    create_markdown_artifact(
        mask_text(summary_markdown(res)), key=artifact_key("evaluation-summary", run), description=f"step {res['step']}"
    )
    for g in res["regressions"]:
        log.warning(
            "regression: %s bits per byte %.4f -> %.4f (%+.1f%%)",
            g["lang"],
            g["previous_bpb"],
            g["bpb"],
            100 * g["change"],
        )
    overall = [
        {k: r[k] for k in ("task", "metric", "value", "n")}
        for r in res["task_rows"]
        if r["task"] != "validation" and r["scope"] == "overall"
    ]
    skips = [{k: r[k] for k in ("task", "lang", "note")} for r in res["task_rows"] if r["metric"] == "skipped"]
    return {k: res[k] for k in ("step", "results", "regressions", "seconds", "tokens")} | {
        "config": to_dict(cfg),
        "tasks": overall,
        "skipped": skips,
    }
