"""Runs side by side (``bloomline dashboard A B C``, eval/pages/compare.py): a base (an evaluated
published model, no recipe) and two continued runs of one recipe that differ by their seed; each
language's bits per byte and task accuracy, the difference from the base and the seed spread, on a
page that draws offline in Chromium with a planted run name shown as text."""

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

from typer.testing import CliRunner

from eval.results.metrics import LangTotals, metric_rows
from eval.results.rows import long_rows
from eval.results.table import write_results
from eval.tasks.base import Row, with_means
from tests.support.browser import open_page, planted


def evaluated(run: Path, bpb: dict[str, float], acc: dict[str, float], step: int, seed: int | None) -> None:
    """``run``'s results at ``step`` with these bits per byte and xstorycloze accuracies, at an
    earlier step too (the page compares the latest); a recipe.json with ``seed`` unless None."""
    for at, worse in ((step // 2, 0.5), (step, 0.0)):
        per = {
            l: LangTotals(nll=900.0, tokens=400, text_nll=(b + worse) * math.log(2) * 1200, bytes=1200, docs=3)
            for l, b in bpb.items()
        }
        ident = {
            "run": run.name,
            "step": at,
            "checkpoint": str(run),
            "precision": "fp32",
            "layout": "hf" if seed is None else "tp=1 pp=1 dp=1 zero_stage=1",
            "data_manifest_sha256": "b" * 64,
            "evaluated_at": datetime.now(timezone.utc),
        }
        tasks = [r.to_dict("xstorycloze") for r in with_means([Row(l, "acc", v, 0.02, 200) for l, v in acc.items()])]
        rows = long_rows([{**ident, **r} for r in metric_rows(per, {})]) + [
            {**ident, **r, "tokens_seen": 0} for r in tasks
        ]
        write_results(run, at, rows, [])
    if seed is not None:
        (run / "recipe.json").write_text(
            json.dumps({"model": {"hidden_size": 64}, "train": {"seed": seed, "steps": step}})
        )


def test_runs_side_by_side_show_each_language_against_the_base_with_the_seed_spread(tmp_path):
    from flows.cli.app import app

    base, one, two = tmp_path / "bloom-560m", tmp_path / "continued-1", tmp_path / ("continued" + planted("run")[0])
    evaluated(base, {"sw": 2.0, "fr": 1.5}, {"sw": 0.50}, 0, None)
    evaluated(one, {"sw": 1.6, "fr": 1.7}, {"sw": 0.60}, 200, seed=1)
    evaluated(two, {"sw": 1.7, "fr": 1.6}, {"sw": 0.55}, 200, seed=2)
    out = tmp_path / "page" / "compare.html"
    res = CliRunner().invoke(app, ["dashboard", str(base), str(one), str(two), "--out", str(out)])
    assert res.exit_code == 0, res.stderr
    html = out.read_text()
    # swahili got better than the base, french worse (forgotten); the task moved with it
    for cell in ("-0.4000", "+0.2000", "-0.3000", "+0.1000", "+0.1000", "+0.0500"):
        assert f'"{cell}"' in html, cell
    assert '"0.0707"' in html and '"0.1000"' in html  # sw's std and range over the two seeds
    assert "step 0" in html and "step 200" in html  # each run's latest evaluation
    dom, console = open_page(out)
    assert "main-svg" in dom and re.search(r"<title>bloomline: comparison", dom), dom[-2000:]
    assert "pwned" not in re.findall(r"<title>[^<]*", dom)[0] and not re.search(
        r"error|uncaught|refused", console, re.I
    )
    res = CliRunner().invoke(app, ["dashboard", str(base), str(tmp_path / "page")])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "has no evaluation results" in lines[0], res.stderr
