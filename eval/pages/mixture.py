"""The dashboard's mixture page (``RUN_DIR/dashboard/mixture.html``), for every run with a
decisions log (every rule writes one: training/data/mixture/fixed.py, online.py): the rule,
the weights over steps as a stacked area, the training tokens seen and the epochs (passes over its
training tokens) per language, and each language's held-out bits per byte against its tokens
seen, with the moments the weights changed marked on every chart.

Sources: ``RUN_DIR/mixture.jsonl`` (the decisions), ``metrics.jsonl`` (tokens drawn per language
per step) and the results table (contract 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eval.pages import html as page
from eval.pages.html import language_line
from eval.pages.html import plotly_text as T
from eval.results.rows import of_languages, validation_rows
from eval.results.table import read_results
from training.checkpoint.run_dir import RunDir
from training.data.mixture.log import read_log
from training.loop.metrics_log import read_metrics


def weight_steps(log: list[dict[str, Any]], last_step: int) -> tuple[list[int], dict[str, list[float]]]:
    """The weights each step drew from, as step-function points: a decision after step s holds
    from step s+1 to the next one (the last until ``last_step``)."""
    moves = [e for e in log if e["weights"] is not None]
    xs = [e["step"] + 1 for e in moves] + [max(last_step, moves[-1]["step"] + 1)]
    langs = sorted(moves[0]["weights"])
    ys = {l: [e["weights"][l] for e in moves] + [moves[-1]["weights"][l]] for l in langs}
    return xs, ys


def mixture_figures(run_dir: Path) -> list[tuple[str, Any]]:
    """The page's charts as (title, figure), in page order: the weights, the tokens seen, the
    epochs (when the metrics log has them), and bits per byte against tokens seen."""
    run = RunDir(run_dir)
    log = read_log(run)
    m = read_metrics(run.metrics)[0] if run.metrics.exists() else []
    last = m[-1]["step"] if m else 0
    changes = [e["step"] for e in log if e["weights"] is not None and e["step"] > 0]
    xs, ys = weight_steps(log, last)
    steps = [r["step"] for r in m]
    langs = sorted(ys)
    seen = {l: np.cumsum([r.get("lang_tokens", {}).get(l, 0) for r in m]) for l in langs}
    figs = [_weights_figure(xs, ys, changes), _seen_figure(steps, langs, seen, changes)]
    epochs = (m[-1].get("lang_epochs") or {}) if m else {}
    if epochs:
        figs.append(_epochs_figure(epochs, m[-1]["step"]))
    rows = of_languages(validation_rows(read_results(run_dir))) if run.results.is_dir() else []
    figs.append(_bpb_figure(rows, steps, langs, seen, changes))
    return figs


def _weights_figure(xs: list[int], ys: dict[str, list[float]], changes: list[int]) -> tuple[str, Any]:
    """The weights over steps as a stacked area (:func:`weight_steps`' points), each change marked."""
    import plotly.graph_objects as go

    f = go.Figure()
    for lang, y in ys.items():
        f.add_trace(
            go.Scatter(x=xs, y=y, name=T(lang), stackgroup="w", line={"shape": "hv", "width": 0.5}, legendgroup=lang)
        )
    for s in changes:
        f.add_vline(x=s + 1, line={"dash": "dot", "width": 0.5, "color": "#888"})
    f.update_layout(xaxis_title="step", yaxis_title="weight", yaxis_range=[0, 1], height=520)
    return f"Language weights over steps ({len(changes)} changes)", f


def _seen_figure(
    steps: list[int], langs: list[str], seen: dict[str, np.ndarray], changes: list[int]
) -> tuple[str, Any]:
    """Each language's training tokens seen by each step, each change marked."""
    import plotly.graph_objects as go

    f = go.Figure()
    for lang in langs:
        f.add_trace(go.Scatter(x=steps, y=seen[lang].tolist(), name=T(lang), legendgroup=lang, mode="lines"))
    for s in changes:
        f.add_vline(x=s, line={"dash": "dot", "width": 0.5, "color": "#888"})
    f.update_layout(xaxis_title="step", yaxis_title="training tokens seen", height=480)
    return "Tokens seen per language", f


def _epochs_figure(epochs: dict[str, float], step: int) -> tuple[str, Any]:
    """The epochs each language had seen by ``step``, most first."""
    import plotly.graph_objects as go

    order = sorted(epochs, key=lambda l: -epochs[l])
    f = go.Figure(go.Bar(x=[T(l) for l in order], y=[epochs[l] for l in order]))
    f.update_layout(xaxis_title="language", yaxis_title="epochs (passes over its training tokens)", height=420)
    return f"Epochs seen per language by step {step}", f


def _bpb_figure(
    rows: list[dict[str, Any]], steps: list[int], langs: list[str], seen: dict[str, np.ndarray], changes: list[int]
) -> tuple[str, Any]:
    """Each language's bits per byte (its validation ``rows``) against its tokens seen, with × where
    the weights changed."""
    import plotly.graph_objects as go

    f = go.Figure()
    for lang in langs:
        line = language_line(rows, lang, "tokens_seen", "bpb", legendgroup=lang)
        if line is None:
            continue
        f.add_trace(line)
        # each change, where this language's curve was at that moment (its tokens seen by then)
        at = [int(seen[lang][steps.index(s)]) for s in changes if s in steps]
        if at:
            xs_ = np.log(np.maximum(line.x, 1))
            f.add_trace(
                go.Scatter(
                    x=at,
                    y=np.interp(np.log(np.maximum(at, 1)), xs_, line.y).tolist(),
                    mode="markers",
                    marker={"symbol": "x", "size": 7},
                    name=T(f"{lang}: weights changed"),
                    legendgroup=lang,
                    showlegend=False,
                )
            )
    f.update_layout(
        xaxis_title="training tokens seen of the language", xaxis_type="log", yaxis_title="bits per byte", height=520
    )
    return "Bits per byte against tokens seen (×: the weights changed)", f


def mixture_page(run_dir: Path) -> str | None:
    """The page's HTML, or None for a run without decisions (one from before every rule logged its start)."""
    log = read_log(RunDir(run_dir))
    if not any(e["weights"] for e in log):
        return None
    sections = [
        page.chart(title, fig, f"mixture-{i}", with_library=i == 0)
        for i, (title, fig) in enumerate(mixture_figures(run_dir))
    ]
    return page.render(
        f"{run_dir.name} mixture",
        sections,
        intro=[
            page.Link("← evaluation", "index.html"),
            page.Link(f" · the language mixture (RUN_DIR/mixture.jsonl): {rule_words(log[0]['cause'])}"),
        ],
    )


def rule_words(start: dict[str, Any]) -> str:
    """The rule a run started with, in words, from its start decision's cause."""
    blend = start.get("blend")
    if blend is None:  # an online rule's start: its settings are in the recipe
        return "online, from batch.blend's weights"
    return ", ".join(f"{k} {v}" for k, v in blend.items())
