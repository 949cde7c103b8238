"""The dashboard opens in headless Chromium (Debian's `chromium`, installed by .ci/run) from
file:// with no network: every chart renders and the console shows no error."""

import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bloomline.config import load_config
from eval.pages.dashboard import all_regressions, build, regression_threshold
from eval.results.rows import validation_rows
from eval.results.table import read_results
from tests.support.browser import chromium, open_page, planted
from tests.support.eval_runs import make_run

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(demo_data):
    return demo_data  # prepared once per session (tests/conftest.py)


def test_dashboard_renders_offline_in_chromium(demo, tmp_path):
    run = tmp_path / "run"
    make_run(run, demo)
    regs = all_regressions(validation_rows(read_results(run)), regression_threshold(run))
    assert [(g["lang"], g["step"]) for g in regs] == [("sw", 300)] and math.isclose(
        regs[0]["change"], 0.7 * 1.3 / 0.8 - 1, rel_tol=1e-9
    )
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
    log = subprocess.run(
        [*base, "--enable-logging=stderr", "--v=0", "--window-size=1400,5000", f"--screenshot={shot}", url],
        capture_output=True,
        text=True,
        timeout=180,
    ).stderr
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
    assert 'href="data.html"' in html
    data = page.parent / "data.html"
    ddom = subprocess.run(
        [*base, "--dump-dom", data.resolve().as_uri()], capture_output=True, text=True, timeout=180
    ).stdout
    assert "<h1>Filter report</h1>" in ddom and "Drops by language and reason" in ddom and "<table>" in ddom


def test_mixture_page_renders_weights_tokens_and_changes_in_chromium(demo, tmp_path):
    """A run steered online: mixture.html, linked from the main page, draws its three charts."""
    run = tmp_path / "run"
    make_run(run, demo)
    langs = sorted({r["lang"] for r in read_results(run).to_pylist() if r["scope"] == "language"})
    start = {l: 1 / len(langs) for l in langs}
    moved = {l: (2 if l == "sw" else 1) / (len(langs) + 1) for l in langs}
    log = [
        {"step": 0, "weights": start, "cause": {"rule": "start"}, "inputs": None},
        {
            "step": 150,
            "weights": moved,
            "cause": {"rule": "evaluation", "checkpoint": 100},
            "inputs": {"checkpoint": 100},
        },
    ]
    (run / "mixture.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "loss": 8 - s / 100, "lr": 1e-4, "lang_tokens": {l: 10 for l in langs}}) + "\n"
            for s in range(1, 301)
        )
    )
    build(run)
    assert 'href="mixture.html"' in (run / "dashboard" / "index.html").read_text()
    page = run / "dashboard" / "mixture.html"
    html = page.read_text()
    assert len(re.findall(r'id="mixture-\d+"', html)) == 3 and "(1 changes)" in html
    base = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
    dom = subprocess.run(
        [*base, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180
    ).stdout
    assert len(re.findall(r'class="main-svg"', dom)) >= 3 and "Tokens seen per language" in dom


def test_markup_in_documents_generations_and_the_run_name_never_runs(tmp_path):
    """Dropped documents (the data page), kept text in prompts and generations (the main page) and
    the run folder's name (every title) carry script-running markup: no page runs it, every page
    shows it as text."""
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import run_all

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "sw"):
        shutil.copy(REPO / f"data_prep/sample_corpus/text/{lang}.jsonl", corpus)
    marks = planted("dropped")
    texts = [f"{marks[0]} {marks[1]} hi", f"{marks[2]} {marks[3]} hi", f"{marks[4]} hi"]  # the page quotes 3 per reason
    docs = [{"id": f"planted-{i}", "lang": "en", "text": t} for i, t in enumerate(texts)]  # too few words
    (corpus / "planted.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml")
    cfg.sources = [SourceConfig(path=str(corpus))]
    data = tmp_path / "data"
    run_all(cfg, data)

    run = tmp_path / ("run" + planted("dir")[0])  # a folder name may hold any markup without a slash
    # prompts are the first tokens of kept validation documents, and generations echo training text:
    # the generations table carries the markup as a crawl's kept document would put it there
    make_run(run, data, gens=[(m, m) for m in planted("gen")], tasks=True, note=planted("note")[0])
    log = [
        {"step": 0, "weights": {"en": 0.5, "sw": 0.5}, "cause": {"rule": "start"}, "inputs": None},
        {"step": 150, "weights": {"en": 0.6, "sw": 0.4}, "cause": {"rule": "bandit"}, "inputs": None},
    ]
    (run / "mixture.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    build(run)
    pages = {p: run / "dashboard" / p for p in ("index.html", "data.html", "mixture.html", "task-continuation.html")}
    for name, path in pages.items():
        dom, console = open_page(path)
        assert "main-svg" in dom or name == "data.html", (name, dom[-2000:])  # the page drew
        assert re.search(r"<title>bloomline: ", dom), (name, re.findall(r"<title>[^<]*", dom))  # no planted script ran
        assert not re.search(r"error|uncaught|refused", console, re.I), (
            name,
            console,
        )  # nor did the policy need to stop one
        assert "bloomline: run&lt;img src=x onerror=" in dom  # the run's name, shown as text in the title
        if name == "data.html":  # every dropped document quoted, as text
            for t in texts:
                assert html.escape(t, quote=False) in dom, t
        if name == "index.html":  # the generations table shows the prompts as written
            assert "&lt;script&gt;document.title='pwned-gen-script'&lt;/script&gt;" in dom and "onload=" in dom


def test_the_policy_stops_markup_that_escaping_missed(demo, tmp_path):
    """The second wall: markup put into a built page unescaped (as a bug would) does not run under
    the page's Content-Security-Policy, while the page's own charts still draw."""
    run = tmp_path / "run"
    make_run(run, demo)
    page = build(run)
    text = page.read_text()
    assert (
        text.count('http-equiv="Content-Security-Policy"') == 1
        and "'unsafe-inline'" not in text.split("script-src")[1].split(";")[0]
    )
    injected = "".join(planted("raw"))
    page.write_text(text.replace("<h1>", injected + "<h1>", 1))
    dom, console = open_page(page)
    assert re.search(r"<title>bloomline: ", dom), re.findall(r"<title>[^<]*", dom)
    assert re.search(r"Content Security Policy", console), console  # refused by the policy, not by luck
    assert len(re.findall(r'class="main-svg"', dom)) >= 8  # plotly's own scripts run under it


def test_task_pages_show_every_language_and_the_signal_report_in_chromium(demo, tmp_path):
    """A run evaluated with a task: its page draws the metric per language and the heatmap, says
    which language was not evaluated and why, and its signal report finds swahili above chance
    and rising (Spearman's ρ = 1) and the others at chance; the main page links it and plots the
    families' means."""
    from eval.pages.tasks import signal
    from eval.pages.tasks import task_rows as rows_of

    run = tmp_path / "run"
    make_run(run, demo, tasks=True)
    report = {(s["metric"], s["lang"]): s for s in signal(rows_of(run), "continuation")}
    assert report[("acc", "sw")]["above_chance"] is True and report[("acc", "sw")]["spearman"] == pytest.approx(1.0)
    assert report[("acc", "en")]["above_chance"] is False and report[("acc", "en")]["spearman"] is None
    assert ("acc", "yo") not in report
    index = build(run)
    html = index.read_text()
    assert 'href="task-continuation.html"' in html and "Tasks: each family" in html
    dom, console = open_page(run / "dashboard" / "task-continuation.html")
    assert not re.search(r"error|uncaught|refused", console, re.I), console
    assert len(re.findall(r'class="main-svg"', dom)) >= 4  # per language, heatmap, report, not evaluated
    assert "signal report (1 of" in dom and "fewer than 4 windows of 48 tokens" in dom
    idom, _ = open_page(index)
    assert "continuation acc: all" in idom


def test_a_run_from_imported_weights_shows_each_language_s_change_from_step_0():
    """Step 0 of a run with train.init_from is the imported model: the dashboard's first chart is
    each language's change from it to the latest checkpoint, the most forgotten first."""
    from eval.pages.dashboard import change_from_import

    points = [("en", 0, 2.0), ("en", 4, 1.5), ("sw", 0, 3.0), ("sw", 4, 3.3), ("yo", 0, 2.0), ("zu", 4, 1.0)]
    title, fig = change_from_import([{"lang": l, "step": s, "bpb": b} for l, s, b in points])
    assert title == "Change from the imported model (step 0 → 4): 1 languages gained, 1 forgot"
    assert list(fig.data[0].x) == ["sw", "en"] and [round(y, 9) for y in fig.data[0].y] == [10.0, -25.0]
