"""The dashboard opens in headless Chromium (Debian's `chromium`, installed by .ci/run) from
file:// with no network: every chart renders and the console shows no error."""

import json
import math
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bloomline.config import load_config
from bloomline.io import sha256_file
from eval.dashboard import all_regressions, build, regression_threshold
from eval.metrics import LangTotals, metric_rows
from eval.results import read_results, write_results
from training.checkpoint import make_meta
from training.config import TrainRecipe

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(demo_data):
    return demo_data  # prepared once per session (tests/conftest.py)


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "the browser test needs Debian's chromium (apt-get install -y chromium; .ci/run installs it)"
    return exe


def make_run(run: Path, demo: Path) -> None:
    """Three evaluated checkpoints of a run (swahili regresses at the last), its metrics and a
    bloomline.json that points at the demo data (whose ledger the dashboard shows)."""
    manifest = json.loads((demo / "manifest.json").read_text())
    langs = sorted(l for l in manifest["languages"] if l != "_unknown")  # every language the data has
    for step in (100, 200, 300):
        per = {l: LangTotals(nll=1000.0 * (1 - step / 1000), tokens=400, text_nll=900.0 * (1 - step / 1000)
                             * (1.3 if (l == "sw" and step == 300) else 1.0), bytes=1200, docs=3) for l in langs}
        ident = {"run": run.name, "step": step, "checkpoint": str(run / f"checkpoints/step_{step}"), "precision": "fp32",
                 "layout": "tp=1 pp=1 dp=1 zero_stage=1", "data_manifest_sha256": "a" * 64,
                 "evaluated_at": datetime.now(timezone.utc)}
        gens = [{"run": run.name, "step": step, "lang": "sw", "k": 0, "prompt": "Habari za", "completion": f"asubuhi {step}",
                 "precision": "fp32", "evaluated_at": ident["evaluated_at"]}]
        write_results(run, step, [{**ident, **r} for r in metric_rows(per, {l: 10 * step for l in langs})], gens)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 8 - s / 100, "lr": 1e-4 * min(1, s / 50)}) + "\n"
                                               for s in range(1, 301)))
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    step = run / "checkpoints" / "step_300"
    step.mkdir(parents=True)
    sampler = {"version": 2, "seed": 1, "step": 300, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    (step / "bloomline.json").write_text(json.dumps(make_meta(300, r, demo, sha256_file(demo / "manifest.json"), sampler,
                                                              {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0,
                                                               "loss_ema": None})))
    (run / "checkpoints" / "latest").write_text("step_300")


def test_dashboard_renders_offline_in_chromium(demo, tmp_path):
    run = tmp_path / "run"
    make_run(run, demo)
    regs = all_regressions(read_results(run).to_pylist(), regression_threshold(run))
    assert [(g["lang"], g["step"]) for g in regs] == [("sw", 300)] and math.isclose(regs[0]["change"], 0.7 * 1.3 / 0.8 - 1, rel_tol=1e-9)
    # the run's own regression_threshold rules the dashboard too (its recipe.json)
    recipe = json.loads((run / "recipe.json").read_text()) if (run / "recipe.json").exists() else None
    assert regression_threshold(run) == (recipe["evaluation"]["settings"]["regression_threshold"] if recipe else 0.02)
    (run / "recipe.json").write_text(json.dumps({"evaluation": {"settings": {"regression_threshold": 0.9}}}))
    assert regression_threshold(run) == 0.9 and "more than 90%): 0" in build(run).read_text()
    (run / "recipe.json").unlink()
    page = build(run)
    html = page.read_text()
    from html.parser import HTMLParser

    class Sources(HTMLParser):
        srcs: list = []

        def handle_starttag(self, tag, attrs):
            self.srcs += [v for k, v in attrs if k in ("src", "href") and tag in ("script", "link")]

    p = Sources()
    p.feed(html)
    assert p.srcs == [] and html.count("<script") >= 7  # plotly inlined: the page fetches nothing
    shot = tmp_path / "dashboard.png"
    url = page.resolve().as_uri()
    base = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    log = subprocess.run([*base, "--enable-logging=stderr", "--v=0", "--window-size=1400,5000", f"--screenshot={shot}", url],
                         capture_output=True, text=True, timeout=180).stderr
    charts = len(re.findall(r'id="chart-\d+"', html))
    assert charts == 8
    assert len(re.findall(r'class="main-svg"', dom)) >= charts  # every chart drew its SVG
    assert "sw" in dom and "+13.8%" in dom  # the regression is in the table
    assert "Generations at step 300" in dom and "asubuhi 300" in dom and "asubuhi 200" not in dom  # the latest step's
    console = [l for l in log.splitlines() if "CONSOLE" in l]
    assert not [l for l in console if re.search(r"error|uncaught", l, re.I)], console
    assert shot.stat().st_size > 50_000
    print(f"screenshot: {shot}")
    # the data page: the data's filter report, linked from the main page, renders offline too
    assert "href='data.html'" in html
    data = page.parent / "data.html"
    ddom = subprocess.run([*base, "--dump-dom", data.resolve().as_uri()], capture_output=True, text=True, timeout=180).stdout
    assert "<h1>Filter report</h1>" in ddom and "Drops by language and reason" in ddom and "<table>" in ddom


def test_mixture_page_renders_weights_tokens_and_changes_in_chromium(demo, tmp_path):
    """A run steered online: mixture.html, linked from the main page, draws its three charts."""
    run = tmp_path / "run"
    make_run(run, demo)
    langs = sorted({r["lang"] for r in read_results(run).to_pylist() if r["scope"] == "language"})
    start = {l: 1 / len(langs) for l in langs}
    moved = {l: (2 if l == "sw" else 1) / (len(langs) + 1) for l in langs}
    log = [{"step": 0, "weights": start, "cause": {"rule": "start"}, "inputs": None},
           {"step": 150, "weights": moved, "cause": {"rule": "evaluation", "checkpoint": 100}, "inputs": {"checkpoint": 100}}]
    (run / "mixture.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 8 - s / 100, "lr": 1e-4,
                                                           "lang_tokens": {l: 10 for l in langs}}) + "\n"
                                               for s in range(1, 301)))
    build(run)
    assert "href='mixture.html'" in (run / "dashboard" / "index.html").read_text()
    page = run / "dashboard" / "mixture.html"
    html = page.read_text()
    assert len(re.findall(r'id="mixture-\d+"', html)) == 3 and "(1 changes)" in html
    base = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
    dom = subprocess.run([*base, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180).stdout
    assert len(re.findall(r'class="main-svg"', dom)) >= 3 and "Tokens seen per language" in dom
