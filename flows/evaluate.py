"""The Prefect flow ``evaluate``: one checkpoint, per language, into the run's results (contract 3),
its TensorBoard, and two Prefect artifacts.

:func:`run_evaluation` is the Prefect-free core (evaluate → publish → TensorBoard → regressions);
the flow adds the artifacts: a table (languages × metrics) and a markdown summary (best and worst
languages, the biggest changes since the previous checkpoint, the regressions).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bloomline.config import from_dict, to_dict
from eval.config import EvalConfig
from eval.evaluate import evaluate
from eval.results import read_results, write_results


def run_dir_of(ckpt_dir: Path) -> Path:
    """RUN_DIR of RUN_DIR/checkpoints/step_N."""
    return ckpt_dir.resolve().parent.parent


def previous_rows(run_dir: Path, step: int) -> dict[str, dict[str, Any]]:
    """Language rows of the latest evaluation before ``step``, by language."""
    t = read_results(run_dir).to_pylist()
    earlier = [r["step"] for r in t if r["step"] < step]
    if not earlier:
        return {}
    last = max(earlier)
    return {r["lang"]: r for r in t if r["step"] == last and r["scope"] == "language"}


def regressions(rows: list[dict[str, Any]], before: dict[str, dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """Languages whose bits per byte rose by more than ``threshold`` (relative) since ``before``."""
    out = []
    for r in rows:
        old = before.get(r["lang"])
        if r["scope"] != "language" or old is None or not (old["bpb"] > 0 and math.isfinite(r["bpb"])):
            continue
        change = (r["bpb"] - old["bpb"]) / old["bpb"]
        if change > threshold:
            out.append({"lang": r["lang"], "step": r["step"], "previous_step": old["step"], "bpb": r["bpb"],
                        "previous_bpb": old["bpb"], "change": change})
    return out


def write_tensorboard(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Per-language and aggregate scalars at the checkpoint's step, in the run's TensorBoard folder,
    under BLOOM's names (``lm-loss-validation/<set>/lm loss validation``) plus bits per byte."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(run_dir / "tensorboard"), filename_suffix=".eval")
    for r in rows:
        name = r["lang"] if r["scope"] == "language" else f"{r['lang']}-{'tokens' if r['weighting'] == 'tokens' else 'mean'}"
        for tag, v in ((f"lm-loss-validation/{name}/lm loss validation", r["loss"]),
                       (f"lm-loss-validation/{name}/lm loss validation ppl", r["ppl"]),
                       (f"bits-per-byte-validation/{name}/bits per byte", r["bpb"])):
            if math.isfinite(v):
                w.add_scalar(tag, v, r["step"])
    w.close()


def run_evaluation(ckpt_dir: str | Path, data_dir: str | Path, cfg: EvalConfig, out: str | Path | None = None,
                   progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Evaluate one checkpoint and publish its results into ``out`` (default: the checkpoint's run)."""
    ckpt_dir = Path(ckpt_dir)
    run_dir = Path(out).resolve() if out else run_dir_of(ckpt_dir)
    ev = evaluate(ckpt_dir, data_dir, cfg, run=run_dir.name, stamp=run_dir / "eval" / "data_verified.json",
                  progress=progress)
    step = ev.rows[0]["step"]
    before = previous_rows(run_dir, step)
    path = write_results(run_dir, step, ev.rows, ev.generations)
    write_tensorboard(run_dir, ev.rows)
    from eval.dashboard import build

    dashboard = build(run_dir)  # every evaluation refreshes it
    return {"step": step, "results": str(path), "dashboard": str(dashboard), "rows": ev.rows, "generations": ev.generations,
            "regressions": regressions(ev.rows, before, cfg.regression_threshold), "previous": before,
            "seconds": ev.seconds, "tokens": ev.tokens}


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and hyphens): ``zh-Hans`` → ``zh-hans``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def summary_markdown(res: dict[str, Any], top: int = 5) -> str:
    langs = [r for r in res["rows"] if r["scope"] == "language" and math.isfinite(r["bpb"])]
    by_bpb = sorted(langs, key=lambda r: r["bpb"])
    lines = [f"# Evaluation at step {res['step']}", "",
             f"{len(langs)} languages, {res['tokens']:,} tokens in {res['seconds']:.1f} s.", ""]
    overall = next((r for r in res["rows"] if r["scope"] == "overall" and r["weighting"] == "tokens"), None)
    if overall:
        lines += [f"Overall bits per byte {overall['bpb']:.4f} (token-weighted), loss {overall['loss']:.4f}.", ""]
    lines += ["## Best (lowest bits per byte)", *[f"- {r['lang']}: {r['bpb']:.4f}" for r in by_bpb[:top]], "",
              "## Worst", *[f"- {r['lang']}: {r['bpb']:.4f}" for r in by_bpb[::-1][:top]], ""]
    prev = res["previous"]
    if prev:
        changes = sorted(((r["bpb"] - prev[r["lang"]]["bpb"], r["lang"]) for r in langs if r["lang"] in prev),
                         key=lambda c: -abs(c[0]))
        lines += [f"## Biggest changes since step {next(iter(prev.values()))['step']}",
                  *[f"- {lang}: {d:+.4f}" for d, lang in changes[:top]], ""]
    regs = res["regressions"]
    lines += ["## Regressions", *([f"- **{g['lang']}**: bits per byte {g['previous_bpb']:.4f} → {g['bpb']:.4f} "
                                   f"({g['change']:+.1%})" for g in regs] or ["none"])]
    return "\n".join(lines)


@flow(name="evaluate", persist_result=False)
def evaluate_flow(checkpoint: str, data: str, config: dict[str, Any], out: str | None = None) -> dict[str, Any]:
    """Evaluate one checkpoint per language; results, TensorBoard scalars and two artifacts."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    log = get_run_logger()
    cfg = from_dict(EvalConfig, config)
    res = task(run_evaluation, name="evaluate-checkpoint", cache_policy=NONE, persist_result=False)(
        checkpoint, data, cfg, out, progress=log.info)
    run = Path(res["results"]).parents[2].name
    cols = ("lang", "family", "loss", "ppl", "bpb", "tokens", "bytes", "docs", "tokens_seen")
    table = [{k: (round(r[k], 6) if isinstance(r[k], float) else r[k]) for k in cols}
             for r in res["rows"] if r["scope"] == "language"]
    create_table_artifact(table, key=artifact_key("evaluation", run), description=f"step {res['step']}")
    create_markdown_artifact(summary_markdown(res), key=artifact_key("evaluation-summary", run),
                             description=f"step {res['step']}")
    for g in res["regressions"]:
        log.warning("regression: %s bits per byte %.4f -> %.4f (%+.1f%%)", g["lang"], g["previous_bpb"], g["bpb"],
                    100 * g["change"])
    return {k: res[k] for k in ("step", "results", "regressions", "seconds", "tokens")} | {"config": to_dict(cfg)}
