"""The dashboard's task pages (``RUN_DIR/dashboard/task-<name>.html``), one per evaluated task other
than the validation split's: each metric per language over checkpoints, a language × checkpoint
heatmap, the languages the task could not evaluate and why, and the **signal report**: per
language, whether the latest value is above the task's chance level by more than 2 standard
errors, and Spearman's ρ of the metric over the checkpoints (rank correlation with the step).
That is the test HF's FineTasks used to choose multilingual tasks that give an early signal
(monotonic, above chance); here it runs on the run's own checkpoints as they are evaluated.

The main page's overview (:func:`overview`) plots each task's metrics as the mean over each BLOOM
family's languages. Source: the results table (contract 3), through its one reader.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from eval.pages import html as page
from eval.pages.html import language_by_step, lines_per_language
from eval.pages.html import plotly_text as T
from eval.results.rows import VALIDATION, is_language
from eval.results.table import read_results


def task_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of every task but the validation split's."""
    t = read_results(run_dir)
    return [r for r in t.to_pylist() if r["task"] != VALIDATION]


def chance(task: str) -> dict[str, float]:
    """Each metric's chance level for ``task`` (empty when unknown)."""
    from eval.tasks import REGISTRY

    if task not in REGISTRY:
        return {}
    import importlib

    module, cls = REGISTRY[task].split(":")
    return dict(getattr(importlib.import_module(module), cls).chance or {})


def spearman(steps: list[int], values: list[float]) -> Optional[float]:
    """Spearman's ρ of ``values`` against ``steps`` (None below 3 checkpoints or with no variation):
    Pearson's r of their ranks, tied values sharing their mean rank, as ``scipy.stats.spearmanr``
    computes it (tests/eval/pages/test_tasks.py). In numpy: importing scipy.stats took 0.9 s of
    each evaluation, whose pages are rebuilt after every checkpoint."""
    if len(steps) < 3 or len(set(values)) < 2 or len(set(steps)) < 2:
        return None
    return float(np.corrcoef(_mean_ranks(steps), _mean_ranks(values))[0, 1])


def _mean_ranks(x: list[float]) -> np.ndarray:
    """1-based ranks; equal values get the mean of the ranks they span."""
    _, which, counts = np.unique(np.asarray(x, dtype=float), return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return ((last - counts + 1 + last) / 2)[which]


def signal(rows: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    """Per (metric, language): the latest value, its stderr, whether it beats chance by more than
    2 stderr, and Spearman's ρ over the checkpoints."""
    floor = chance(task)
    out = []
    lang_rows = [r for r in rows if r["task"] == task and is_language(r) and r["metric"] != "skipped"]
    for metric, lang in sorted({(r["metric"], r["lang"]) for r in lang_rows}):
        pts = sorted(
            (r["step"], r["value"], r["stderr"])
            for r in lang_rows
            if (r["metric"], r["lang"]) == (metric, lang) and r["value"] is not None
        )
        if not pts:
            continue
        step, value, se = pts[-1]
        c = floor.get(metric)
        above = None if c is None or se is None or not math.isfinite(se) else value - c > 2 * se
        out.append(
            {
                "metric": metric,
                "lang": lang,
                "step": step,
                "value": value,
                "stderr": se,
                "chance": c,
                "above_chance": above,
                "spearman": spearman([p[0] for p in pts], [p[1] for p in pts]),
            }
        )
    return out


def _figures(rows: list[dict[str, Any]], task: str) -> list[tuple[str, Any]]:
    """``task``'s page, as (title, figure) in page order: each metric's charts, the signal report,
    then the languages not evaluated (when there are any)."""
    figs = _metric_figures(rows, task)
    figs.append(_signal_table(rows, task))
    skips = _skipped_table(rows, task)
    return figs + ([skips] if skips else [])


def _metric_figures(rows: list[dict[str, Any]], task: str) -> list[tuple[str, Any]]:
    """Per metric of ``task``: its value per language over checkpoints (with the chance level where
    known), and the language × checkpoint heatmap."""

    figs = []
    mine = [r for r in rows if r["task"] == task and is_language(r) and r["metric"] != "skipped"]
    floor = chance(task)
    for metric in sorted({r["metric"] for r in mine}):
        rs = [r for r in mine if r["metric"] == metric]
        langs = sorted({r["lang"] for r in rs})
        steps = sorted({r["step"] for r in rs})
        f = lines_per_language(rs, "value", langs, metric, 480)
        if metric in floor:
            f.add_hline(y=floor[metric], line={"dash": "dot", "color": "#888"}, annotation_text="chance")
        figs.append((f"{task}: {metric} per language", f))
        f = language_by_step(rs, "value", langs, steps, metric)
        figs.append((f"{task}: {metric}, language × checkpoint", f))
    return figs


def _signal_table(rows: list[dict[str, Any]], task: str) -> tuple[str, Any]:
    """:func:`signal`'s report of ``task`` as a table, its title counting the languages above chance."""
    import plotly.graph_objects as go

    report = signal(rows, task)
    yes = lambda v: "-" if v is None else ("yes" if v else "no")  # noqa: E731
    f = go.Figure(
        go.Table(
            header={
                "values": [
                    "metric",
                    "language",
                    "step",
                    "value",
                    "± stderr",
                    "chance",
                    "above chance by > 2 stderr",
                    "Spearman ρ over checkpoints",
                ]
            },
            cells={
                "values": [
                    [T(s["metric"]) for s in report],
                    [T(s["lang"]) for s in report],
                    [s["step"] for s in report],
                    [f"{s['value']:.4f}" for s in report],
                    ["-" if s["stderr"] is None else f"{s['stderr']:.4f}" for s in report],
                    ["-" if s["chance"] is None else f"{s['chance']:.3f}" for s in report],
                    [yes(s["above_chance"]) for s in report],
                    ["-" if s["spearman"] is None else f"{s['spearman']:+.2f}" for s in report],
                ]
            },
        )
    )
    f.update_layout(height=120 + 22 * max(1, len(report)))
    n_yes = sum(bool(s["above_chance"]) for s in report)
    return f"{task}: signal report ({n_yes} of {len(report)} above chance at the latest checkpoint)", f


def _skipped_table(rows: list[dict[str, Any]], task: str) -> Optional[tuple[str, Any]]:
    """The languages ``task`` could not evaluate and why, as a table; None when it evaluated all."""
    import plotly.graph_objects as go

    skips = sorted({(r["lang"], r["note"]) for r in rows if r["task"] == task and r["metric"] == "skipped"})
    if not skips:
        return None
    f = go.Figure(
        go.Table(
            header={"values": ["language", "not evaluated because"]},
            cells={"values": [[T(l) for l, _ in skips], [T(n) for _, n in skips]], "align": "left"},
        )
    )
    f.update_layout(height=120 + 22 * len(skips))
    return f"{task}: languages not evaluated ({len(skips)})", f


def task_pages(run_dir: Path) -> dict[str, str]:
    """``{file name: page HTML}`` of every task the run's results hold (none without tasks)."""
    rows = task_rows(run_dir)
    out = {}
    for task in sorted({r["task"] for r in rows}):
        sections = [
            page.chart(title, fig, f"task-{i}", with_library=i == 0)
            for i, (title, fig) in enumerate(_figures(rows, task))
        ]
        out[page_name(task)] = page.render(
            f"{run_dir.name} {task}", sections, heading=f"task {task}", intro=[page.Link("← evaluation", "index.html")]
        )
    return out


def page_name(task: str) -> str:
    """The task page's file name (task names are the registry's: letters, digits, underscores)."""
    return f"task-{''.join(c if c.isalnum() or c in '-_' else '_' for c in task)}.html"


def overview(run_dir: Path) -> Optional[tuple[str, Any]]:
    """The main page's chart of each task's metrics, as each family's (and all languages') mean
    over checkpoints; None without tasks."""
    import plotly.graph_objects as go

    means = [r for r in task_rows(run_dir) if r["scope"] in ("group", "overall") and r["weighting"] == "mean"]
    if not means:
        return None
    f = go.Figure()
    for task, metric, fam in sorted({(r["task"], r["metric"], r["lang"]) for r in means}):
        pts = sorted(
            (r["step"], r["value"]) for r in means if (r["task"], r["metric"], r["lang"]) == (task, metric, fam)
        )
        f.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="lines+markers",
                name=T(f"{task} {metric}: {fam}"),
                line={"dash": "solid" if fam == "all" else "dot"},
            )
        )
    f.update_layout(xaxis_title="step", yaxis_title="mean over the family's languages", height=460)
    return "Tasks: each family's mean per task (the task pages have every language)", f
