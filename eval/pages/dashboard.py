"""The run's HTML dashboard (``bloomline dashboard RUN_DIR`` → ``RUN_DIR/dashboard/index.html``).

One self-contained file that works from ``file://`` with no internet: plotly's JavaScript is
inlined once (plotly: interactive charts from Python with no native dependency; a legend click
hides a language, a double click isolates it, which is how one reads ~60 series). Charts: for a
run started from imported weights (``train.init_from``), each language's change from that model
(its step 0) to the latest checkpoint, gained or forgotten; bits per byte per language over checkpoints, a language × checkpoint heatmap, the group aggregates,
bits per byte against training tokens seen per language, the training loss and learning rate
(``metrics.jsonl``), the flagged regressions, and the data ledger of the run's manifest; and,
beside it, ``data.html``: the data's filter report (data_prep/reports/filter_report.py: drops by language and
reason with examples, kept documents near a threshold), linked from the main page; and, for a run
whose decisions log has weights (every rule writes its start), ``mixture.html`` (eval/pages/mixture.py); for every task beside
the validation split, ``task-<name>.html`` with its signal report, and the families' means on the
main page (eval/pages/tasks.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bloomline.io import write_bytes_atomic
from eval.pages import html as page
from eval.pages.html import language_by_step, language_line, lines_per_language
from eval.pages.html import plotly_text as T
from eval.pages.mixture import mixture_page
from eval.pages.tasks import overview, task_pages
from eval.results.metrics import change_from, regressions
from eval.results.rows import is_language, of_languages, validation_rows
from eval.results.table import read_generations, read_results
from training.checkpoint.run_dir import RunDir
from training.loop.metrics_log import read_metrics


def _data_dir(run_dir: Path) -> str | None:
    """Where the run's data is (a path, or a URL), as its latest checkpoint records it."""
    from training.checkpoint.meta import read_meta
    from training.checkpoint.run_dir import RunDir

    latest = RunDir(run_dir).latest_dir()
    return None if latest is None else read_meta(latest)["data_dir"]


def _manifest(run_dir: Path) -> dict[str, Any] | None:
    from data_prep.storage.shards import load_manifest

    data = _data_dir(run_dir)
    return None if data is None else load_manifest(data)


def data_page(run_dir: Path) -> str | None:
    """The filter report of the run's data as HTML (its quoted documents shown as text), or None
    when the data has no drop log (prepared before it existed) or the run no checkpoint."""
    from data_prep.reports.filter_report import report

    data = _data_dir(run_dir)
    if data is None or "dropped" not in (_manifest(run_dir) or {}):
        return None
    return page.render(
        f"{run_dir.name} data",
        [page.markdown("", report(data, examples=3))],
        intro=[page.Link("← evaluation", "index.html"), page.Link(f" · data: {data}")],
    )


def regression_threshold(run_dir: Path) -> float:
    """The run's ``evaluation.settings.regression_threshold`` (its recipe.json), else the default:
    the dashboard flags what the evaluate flow flags."""
    from bloomline.config import from_dict
    from training.config import EvalConfig

    recipe = RunDir(run_dir).recipe
    try:
        settings = json.loads(recipe.read_text())["evaluation"]["settings"]
        return from_dict(EvalConfig, settings).regression_threshold
    except (OSError, ValueError, KeyError, TypeError):
        return EvalConfig().regression_threshold


def all_regressions(rows: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """Every language whose bits per byte rose by more than ``threshold`` between two consecutive evaluations."""
    steps = sorted({r["step"] for r in rows})
    by_step = {s: [r for r in rows if r["step"] == s] for s in steps}
    out = []
    for a, b in zip(steps, steps[1:]):
        before = {r["lang"]: r for r in by_step[a] if is_language(r)}
        out += regressions(by_step[b], before, threshold)
    return out


Figure = tuple[str, Any]  # (title, plotly figure)


def figures(run_dir: Path, threshold: float) -> list[Figure]:
    """(title, plotly figure) of every chart, in page order; every text in them from data or a
    model is escaped for plotly (eval/pages/html.py plotly_text)."""
    rows = validation_rows(read_results(run_dir))
    langs = of_languages(rows)
    names = sorted({r["lang"] for r in langs})
    figs = [bpb_lines(langs, names), bpb_heatmap(rows, langs, names), groups(rows)]
    if any(r["step"] == 0 for r in langs) and any(r["step"] > 0 for r in langs):  # step 0: the imported model
        figs.insert(0, change_from_import(langs))
    tasks = overview(run_dir)
    if tasks is not None:
        figs.append(tasks)
    figs += [bpb_by_tokens_seen(langs, names), loss_and_lr(run_dir), regressions_table(rows, threshold)]
    figs += [f for f in (generations_table(run_dir), ledger_bars(run_dir)) if f is not None]
    return figs


def bpb_lines(langs: list[dict[str, Any]], names: list[str]) -> Figure:
    return "Bits per byte per language", lines_per_language(langs, "bpb", names, "bits per byte", 520)


def change_from_import(langs: list[dict[str, Any]]) -> Figure:
    """Each language's change in bits per byte from the imported model (step 0) to the latest
    checkpoint: the languages the run taught (down) and those it made the model forget (up)."""
    import plotly.graph_objects as go

    last, changes = change_from(langs, 0)
    gained = sum(c["change"] < 0 for c in changes)
    f = go.Figure(
        go.Bar(
            x=[T(c["lang"]) for c in changes],
            y=[100 * c["change"] for c in changes],
            marker_color=["#2ca02c" if c["change"] < 0 else "#d62728" for c in changes],
            customdata=[[c["base_bpb"], c["bpb"]] for c in changes],
            hovertemplate="%{x}: %{customdata[0]:.4f} → %{customdata[1]:.4f} bpb (%{y:+.2f}%)<extra></extra>",
        )
    )
    f.update_layout(xaxis_title="language", yaxis_title=f"change in bits per byte, step 0 → {last} (%)", height=460)
    title = (
        f"Change from the imported model (step 0 → {last}): {gained} languages gained, {len(changes) - gained} forgot"
    )
    return title, f


def bpb_heatmap(rows: list[dict[str, Any]], langs: list[dict[str, Any]], names: list[str]) -> Figure:
    steps = sorted({r["step"] for r in rows})
    return "Bits per byte, language × checkpoint", language_by_step(langs, "bpb", names, steps, "bpb")


def groups(rows: list[dict[str, Any]]) -> Figure:
    import plotly.graph_objects as go

    f = go.Figure()
    for r_ in sorted({(r["lang"], r["weighting"]) for r in rows if not is_language(r)}):
        pts = sorted((r["step"], r["bpb"]) for r in rows if (r["lang"], r["weighting"]) == r_ and not is_language(r))
        f.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="lines+markers",
                name=f"{T(r_[0])} ({'token-weighted' if r_[1] == 'tokens' else 'mean of languages'})",
                line={"dash": "solid" if r_[1] == "tokens" else "dot"},
            )
        )
    f.update_layout(xaxis_title="step", yaxis_title="bits per byte", height=420)
    return "Groups and overall", f


def bpb_by_tokens_seen(langs: list[dict[str, Any]], names: list[str]) -> Figure:
    import plotly.graph_objects as go

    f = go.Figure()
    for lang in names:
        f.add_trace(language_line(langs, lang, "tokens_seen", "bpb"))
    f.update_layout(xaxis_title="training tokens seen of the language", yaxis_title="bits per byte", height=520)
    return "Bits per byte against tokens seen: starved or hard?", f


def loss_and_lr(run_dir: Path) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    m = read_metrics(RunDir(run_dir).metrics)[0]
    f = make_subplots(specs=[[{"secondary_y": True}]])
    f.add_trace(
        go.Scatter(x=[x["step"] for x in m], y=[x.get("loss") for x in m], name="training loss"), secondary_y=False
    )
    f.add_trace(
        go.Scatter(x=[x["step"] for x in m], y=[x.get("lr") for x in m], name="learning rate"), secondary_y=True
    )
    f.update_layout(xaxis_title="step", height=380)
    return "Training loss and learning rate", f


def regressions_table(rows: list[dict[str, Any]], threshold: float) -> Figure:
    import plotly.graph_objects as go

    regs = all_regressions(rows, threshold)
    f = go.Figure(
        go.Table(
            header={"values": ["language", "step", "bits per byte", "before", "change"]},
            cells={
                "values": [
                    [T(g["lang"]) for g in regs],
                    [f"{g['previous_step']} → {g['step']}" for g in regs],
                    [f"{g['bpb']:.4f}" for g in regs],
                    [f"{g['previous_bpb']:.4f}" for g in regs],
                    [f"{g['change']:+.1%}" for g in regs],
                ]
            },
        )
    )
    f.update_layout(height=120 + 24 * max(1, len(regs)))
    return f"Regressions (bits per byte up more than {threshold:.0%}): {len(regs)}", f


def generations_table(run_dir: Path) -> Figure | None:
    """The last evaluated step's greedy completions; None before any."""
    import plotly.graph_objects as go

    gens = read_generations(run_dir).to_pylist()
    if not gens:
        return None
    last = max(g["step"] for g in gens)
    g = sorted((x for x in gens if x["step"] == last), key=lambda x: (x["lang"], x["k"]))
    f = go.Figure(
        go.Table(
            header={"values": ["language", "prompt", "greedy completion"]},
            cells={
                "values": [[T(x["lang"]) for x in g], [T(x["prompt"]) for x in g], [T(x["completion"]) for x in g]],
                "align": "left",
            },
        )
    )
    f.update_layout(height=120 + 40 * len(g))
    return f"Generations at step {last}", f


def ledger_bars(run_dir: Path) -> Figure | None:
    """The data's ledger (its manifest): documents kept and dropped by reason; None without the data."""
    import plotly.graph_objects as go

    manifest = _manifest(run_dir)
    if not manifest:
        return None
    ledger = sorted(manifest["languages"].items())
    f = go.Figure()
    f.add_trace(go.Bar(x=[T(l) for l, _ in ledger], y=[e["docs_kept"] for _, e in ledger], name="kept"))
    for kind in ("filtered", "duplicates", "errors"):
        for reason in sorted({k for _, e in ledger for k in e.get(kind, {})}):
            f.add_trace(
                go.Bar(
                    x=[T(l) for l, _ in ledger],
                    y=[e.get(kind, {}).get(reason, 0) for _, e in ledger],
                    name=T(f"{kind}: {reason}"),
                )
            )
    f.update_layout(barmode="stack", yaxis_title="documents in", height=480)
    return "Data ledger: documents in, kept and dropped by reason", f


def build(run_dir: str | Path, threshold: float | None = None) -> Path:
    """Write ``RUN_DIR/dashboard/index.html`` (atomically) and return its path; regressions are
    flagged above ``threshold`` (default: the run's own :func:`regression_threshold`)."""
    run_dir = Path(run_dir)
    threshold = regression_threshold(run_dir) if threshold is None else threshold
    sections = [
        page.chart(title, fig, f"chart-{i}", with_library=i == 0)
        for i, (title, fig) in enumerate(figures(run_dir, threshold))
    ]
    rows = read_results(run_dir).num_rows
    intro = [page.Link(f"{rows} result rows; evaluation contract: eval/RESULTS.md")]
    data = data_page(run_dir)
    if data is not None:
        write_bytes_atomic(RunDir(run_dir).dashboard / "data.html", data.encode("utf-8"))
        intro += [page.Link(" · "), page.Link("data: filter report", "data.html")]
    for name, html in task_pages(run_dir).items():
        write_bytes_atomic(RunDir(run_dir).dashboard / name, html.encode("utf-8"))
        intro += [page.Link(" · "), page.Link(f"task {name[5:-5]}", name)]
    mixture = mixture_page(run_dir)
    if mixture is not None:
        write_bytes_atomic(RunDir(run_dir).dashboard / "mixture.html", mixture.encode("utf-8"))
        intro += [page.Link(" · "), page.Link("language mixture", "mixture.html")]
    html = page.render(run_dir.name, sections, heading=f"bloomline run {run_dir.name}", intro=intro)
    out = RunDir(run_dir).dashboard / "index.html"
    write_bytes_atomic(out, html.encode("utf-8"))
    return out
