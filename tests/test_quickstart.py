"""The three quick starts of docs/quickstart/, run end to end as a user runs them, with tiny
stand-ins: a tiny Hugging Face BLOOM made by the test (bloom-tiny's shape) for the published model,
and real text in four languages BLOOM never saw (../shared/corpus-extra: Turkish, Thai, Korean,
Finnish) for the user's corpus, beside two languages it knew (Swahili, French) in the held-out text.
The scripts are run unchanged; only sizes are shrunk, through the -o they pass on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "docs" / "quickstart"
EXTRA = REPO.parent / "shared" / "corpus-extra" / "text"
NEW = ["fi", "ko", "th", "tr"]
KNOWN = ["fr", "sw"]
TINY = [  # the sizes a 2-core CPU runs in seconds (bloom-tiny's recipe, the published model's shape here)
    "-o", f"train.recipe={REPO / 'configs/train/bloom-tiny.yaml'}", "-o", "train.train.steps=4",
    "-o", "train.checkpoint.interval=2", "-o", "data.pack.buckets=[64,128,256,512]",
    "-o", "data.tokenizer.extend_with=300", "-o", "data.dask.n_workers=1",
]  # fmt: skip


def run(script: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.update(DS_ACCELERATOR="cpu", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    res = subprocess.run(
        ["bash", str(QUICK / script), *map(str, args)], capture_output=True, text=True, timeout=900, env=env, cwd="/"
    )
    assert res.returncode == 0, f"{script}: {res.stderr[-4000:]}"
    return res


def texts(tmp: Path) -> tuple[Path, Path, Path]:
    """(the corpus: every document of each new language from one source, SIB-200's sentences; clean
    text to derive its thresholds from, the other source, NTREX's news; held-out text: 6 more NTREX
    documents of each, and 6 of each known language from the sample corpus)."""
    corpus, clean, heldout = tmp / "corpus", tmp / "clean", tmp / "heldout"
    for d in (corpus, clean, heldout):
        d.mkdir()
    for lang in NEW:
        docs = (EXTRA / f"{lang}.jsonl").read_text(encoding="utf-8").splitlines()
        news = [d for d in docs if "NTREX" in json.loads(d)["source"]]
        (corpus / f"{lang}.jsonl").write_text("\n".join(d for d in docs if d not in news) + "\n", encoding="utf-8")
        (clean / f"{lang}.jsonl").write_text("\n".join(news[6:]) + "\n", encoding="utf-8")
        (heldout / f"{lang}.jsonl").write_text("\n".join(news[:6]) + "\n", encoding="utf-8")
    for lang in KNOWN:
        docs = (REPO / f"data_prep/sample_corpus/text/{lang}.jsonl").read_text(encoding="utf-8").splitlines()
        (heldout / f"{lang}.jsonl").write_text("\n".join(docs[:6]) + "\n", encoding="utf-8")
    return corpus, clean, heldout


def clean_drops(manifest: dict) -> dict[str, float]:
    """Each language's share of documents the quality filters and language ID dropped."""
    return {l: sum(e["filtered"].values()) / e["docs_in"] for l, e in manifest["languages"].items() if e["docs_in"]}


def language_rows(results: Path) -> dict[tuple[int, str], float]:
    from eval.results.table import read_results

    return {
        (r["step"], r["lang"]): r["value"]
        for r in read_results(results).to_pylist()
        if r["task"] == "validation" and r["metric"] == "bpb" and r["scope"] == "language"
    }


@pytest.mark.slow
def test_prepare_continue_and_evaluate_as_the_quick_starts_say(hf_bloom, tmp_path):
    model = hf_bloom / "model"
    corpus, clean, heldout = texts(tmp_path)

    # prepare my corpus: thresholds derived from clean text of another source, BLOOM's recipe, the
    # recipe named in the manifest; at most 1% of any language lost
    thresholds = tmp_path / "thresholds.yaml"
    derived = subprocess.run(
        [Path(sys.executable).parent / "bloomline", "filters", "--derive", clean], capture_output=True, text=True
    )
    assert derived.returncode == 0, derived.stderr[-3000:]
    thresholds.write_text(derived.stdout)
    out = tmp_path / "prepared"
    res = run(
        "prepare.sh", corpus, out, "-o", f"filters.languages=@{thresholds}",
        "-o", "tokenizer.vocab_size=2000", "-o", "pack.buckets=[64,128,256,512]",
    )  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["file"] == str(REPO / "configs/data/bloom.yaml")
    assert set(manifest["config"]["filters"]["languages"]) == set(NEW)
    drops = clean_drops(manifest)
    assert set(drops) == set(NEW) and max(drops.values()) <= 0.01, drops
    assert all(f"| {l} |" in res.stdout for l in NEW), res.stdout[:3000]  # the filter report
    assert "- fitted (the recipe's `filters.languages`): fi, ko, th, tr" in res.stdout

    # continue the published model on them, on one rank, and compare it with the original
    run("continue.sh", model, corpus, heldout, tmp_path / "adapt", *TINY, "-o", f"data.filters.languages=@{thresholds}")
    record = json.loads((tmp_path / "adapt" / "run" / "pipeline.json").read_text())["outputs"]
    data = json.loads((Path(record["data"]) / "manifest.json").read_text())
    assert max(clean_drops(data).values()) <= 0.01
    assert data["tokenizer"]["extends"]["added"] == 300  # the model's tokenizer, grown on the corpus
    run_rows = language_rows(Path(record["train"]))
    assert {l for s, l in run_rows if s == 0} == set(NEW) and {s for s, _ in run_rows} == {0, 2, 4}
    assert Path(record["dashboard"]).is_file()
    base, continued = language_rows(tmp_path / "adapt" / "base"), language_rows(tmp_path / "adapt" / "continued")
    assert {l for _, l in base} == {l for _, l in continued} == set(NEW + KNOWN)
    page = (tmp_path / "adapt" / "compare.html").read_text()
    assert all(f'"{l}"' in page for l in NEW + KNOWN)

    # evaluate a published BLOOM per language on my text
    run("evaluate.sh", model, heldout, tmp_path / "published", "-o", "prompts_per_lang=0")
    assert language_rows(tmp_path / "published") == base  # the same model on the same text
    assert (tmp_path / "published" / "dashboard" / "index.html").is_file()
