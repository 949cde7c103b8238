"""Runs side by side (``bloomline dashboard A B …``): one self-contained page comparing the latest
evaluation of several runs or evaluated models (a published model's ``evaluate --model`` folder is
one), the first being the base. It answers "is my continued model better than bloom-560m in
Swahili, and did it forget French?":

* bits per byte per language of each run, and each run's difference from the base (negative:
  better than the base);
* every task's accuracy per language of each run, and its difference from the base;
* where runs share a recipe (their ``recipe.json`` equal but for seeds), the spread of bits per
  byte over those seeds per language (standard deviation and range): a difference from the base
  smaller than it is noise, not a finding;
* what each run was evaluated on (its step, the data's manifest sha256): bits per byte compare
  across tokenizers, but only on the same text.

Pages are made by eval/pages/html.py, where every text from data, a model or a user is escaped.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bloomline.errors import BloomlineError
from bloomline.io import write_bytes_atomic
from eval.pages import html as page
from eval.pages.html import plotly_text as T
from eval.results.rows import VALIDATION, is_language
from eval.results.table import read_results
from training.checkpoint.run_dir import RunDir

METRIC = "acc"
"""The task metric compared (every multiple-choice task has it)."""


@dataclass
class Side:
    """One run's latest evaluation."""

    name: str
    step: int
    bpb: dict[str, float]
    """Bits per byte per language."""
    tasks: dict[tuple[str, str], float]
    """(task, language) → accuracy."""
    recipe: str | None
    """The run's recipe less its seeds, canonical JSON (None: a published model's evaluation)."""
    data: str
    """sha256 of the manifest of the text evaluated."""


def _unseeded(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _unseeded(v) for k, v in tree.items() if k != "seed"}
    if isinstance(tree, list):
        return [_unseeded(v) for v in tree]
    return tree


def side(run_dir: Path, name: str) -> Side:
    """The latest evaluated step of ``run_dir``; a one-line error for a folder with no results."""
    rows = [r for r in read_results(run_dir).to_pylist() if is_language(r)]
    if not rows:
        raise BloomlineError(f"{run_dir} has no evaluation results (RUN_DIR/eval/results/): evaluate it first")
    step = max(r["step"] for r in rows)
    rows = [r for r in rows if r["step"] == step]
    recipe = RunDir(run_dir).recipe
    return Side(
        name,
        step,
        {r["lang"]: r["value"] for r in rows if r["task"] == VALIDATION and r["metric"] == "bpb"},
        {(r["task"], r["lang"]): r["value"] for r in rows if r["task"] != VALIDATION and r["metric"] == METRIC},
        json.dumps(_unseeded(json.loads(recipe.read_text())), sort_keys=True) if recipe.is_file() else None,
        rows[0]["data_manifest_sha256"],
    )


def names_of(runs: list[Path]) -> list[str]:
    """Each run's label: its folder's name, with its parent's where two names are the same."""
    names = [r.resolve().name for r in runs]
    return [f"{r.resolve().parent.name}/{n}" if names.count(n) > 1 else n for r, n in zip(runs, names)]


def seed_spread(sides: list[Side]) -> list[dict[str, Any]]:
    """Per group of two or more runs sharing a recipe, per language: the bits per byte's standard
    deviation and range over them."""
    groups: dict[str, list[Side]] = {}
    for s in sides:
        if s.recipe is not None:
            groups.setdefault(s.recipe, []).append(s)
    out = []
    for members in (g for g in groups.values() if len(g) > 1):
        for lang in sorted(set.intersection(*(set(m.bpb) for m in members))):
            v = [m.bpb[lang] for m in members]
            out.append(
                {
                    "runs": ", ".join(m.name for m in members),
                    "lang": lang,
                    "std": statistics.stdev(v),
                    "range": max(v) - min(v),
                }
            )
    return out


def figures(sides: list[Side]) -> list[tuple[str, Any]]:
    """(title, plotly figure) of each chart and table of the page."""
    import plotly.graph_objects as go

    base, rest = sides[0], sides[1:]
    langs = sorted(set().union(*(s.bpb for s in sides)))
    bpb = go.Figure([go.Bar(x=[T(l) for l in langs], y=[s.bpb.get(l) for l in langs], name=T(s.name)) for s in sides])
    bpb.update_layout(barmode="group", yaxis_title="bits per byte", height=480)
    delta = go.Figure(
        [
            go.Bar(
                x=[T(l) for l in langs],
                y=[s.bpb[l] - base.bpb[l] if l in s.bpb and l in base.bpb else None for l in langs],
                name=T(s.name),
            )
            for s in rest
        ]
    )
    delta.update_layout(barmode="group", yaxis_title=f"bits per byte − {T(base.name)}'s (below 0: better)", height=480)
    figs = [
        ("Bits per byte per language", bpb),
        (f"Difference from the base, {base.name}", delta),
        ("Bits per byte per language (table)", _table(sides, langs)),
    ]
    keys = sorted(set().union(*(s.tasks for s in sides)))
    if keys:
        header = ["task", "language", *[s.name for s in sides], *[f"{s.name} − base" for s in rest]]
        cols = [[T(t) for t, _ in keys], [T(l) for _, l in keys]]
        cols += [[_fmt(s.tasks.get(k)) for k in keys] for s in sides]
        cols += [[_fmt(_minus(s.tasks.get(k), base.tasks.get(k)), "+") for k in keys] for s in rest]
        figs.append((f"Task accuracy ({METRIC}) per language", _grid(header, cols, len(keys))))
    spread = seed_spread(sides)
    if spread:
        cols = [
            [T(r["runs"]) for r in spread],
            [T(r["lang"]) for r in spread],
            [_fmt(r["std"]) for r in spread],
            [_fmt(r["range"]) for r in spread],
        ]
        header = ["runs of one recipe", "language", "std of bits per byte", "range"]
        figs.append(("Seed spread: runs that differ only by their seeds", _grid(header, cols, len(spread))))
    return figs


def _table(sides: list[Side], langs: list[str]) -> Any:
    base, rest = sides[0], sides[1:]
    header = ["language", *[s.name for s in sides], *[f"{s.name} − base" for s in rest]]
    cols = [[T(l) for l in langs], *[[_fmt(s.bpb.get(l)) for l in langs] for s in sides]]
    cols += [[_fmt(_minus(s.bpb.get(l), base.bpb.get(l)), "+") for l in langs] for s in rest]
    return _grid(header, cols, len(langs))


def _grid(header: list[str], cols: list[list[str]], n: int) -> Any:
    import plotly.graph_objects as go

    f = go.Figure(go.Table(header={"values": [T(h) for h in header]}, cells={"values": cols, "align": "left"}))
    f.update_layout(height=120 + 24 * n)
    return f


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _fmt(v: float | None, sign: str = "") -> str:
    return "" if v is None else f"{v:{sign}.4f}"


def compare(runs: list[str | Path], out: str | Path) -> Path:
    """Write the comparison page of ``runs`` (the first is the base) to ``out``; its path."""
    runs = [Path(r) for r in runs]
    sides = [side(r, n) for r, n in zip(runs, names_of(runs))]
    sections = [page.chart(t, f, f"chart-{i}", with_library=i == 0) for i, (t, f) in enumerate(figures(sides))]
    intro = [
        page.Link(
            "; ".join(f"{s.name}: step {s.step}, text {s.data[:12]}" for s in sides)
            + (
                ""
                if len({s.data for s in sides}) == 1
                else " (data prepared apart: bits per byte compare across tokenizers, but only on the same text)"
            )
        )
    ]
    html = page.render("comparison", sections, heading=f"{sides[0].name} and {len(sides) - 1} more", intro=intro)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, html.encode("utf-8"))
    return out
