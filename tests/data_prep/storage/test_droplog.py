"""The drop log (DIR/dropped/), the recorded scores (DIR/scores/) and the filter report, on a real
run over the sample corpus with one document for every reason the ledger knows."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bloomline.config import load_config
from bloomline.errors import ConfigError, DataError
from data_prep.config import PrepareConfig, SourceConfig
from data_prep.pipeline import run_all
from data_prep.reports.filter_report import parse_set, what_if
from data_prep.reports.kept_scores import kept_stats
from data_prep.storage.droplog import check_dropped, dropped_counts
from data_prep.storage.shards import load_manifest

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "data_prep" / "sample_corpus"

GOOD = (
    "Every morning the baker opens her shop before sunrise. She kneads the dough, lights the oven and "
    "arranges fresh loaves on wooden shelves while the street slowly wakes up around her."
)


def junk_records():
    """(id, text, lang) of documents each dropped for one reason (under the run's overrides)."""
    rng = random.Random(0)
    long_text = " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(450)
    )
    en = json.loads((SAMPLE / "text" / "en.jsonl").read_text().splitlines()[0])
    fr = json.loads((SAMPLE / "text" / "fr.jsonl").read_text().splitlines()[0])["text"]
    near = en["text"].replace("the", "a", 1)
    return [
        ("j-few", "Just three words.", "en"),
        ("j-many", long_text, "en"),
        ("j-char", "buy now " * 40, "en"),
        ("j-word", GOOD + " " + " ".join(["the market opens at dawn on monday and closes late"] * 6), "en"),
        (
            "j-special",
            GOOD + " $$$ ### @@@ %%% &&& *** ((( ))) 1234567890 1234567890 1234567890 1234567890 !!! ??? ;;; :::",
            "en",
        ),
        ("j-flagged", GOOD + " viagra viagra porn", "en"),
        ("j-short", "x = 1\n", "code-python"),
        ("j-lines", "y = [" + "1, " * 700 + "]\n" + "z = 2\n" * 30, "code-python"),
        ("j-mismatch", fr, "en"),
        ("j-exact", en["text"], "en"),
        ("j-near", near, "en"),
        # hostile ids (issue 37): a megabyte, and one of terminal escapes and rich markup
        (LONG_ID, "Two words.", "en"),
        (HOSTILE_ID, "Only [bold red]x[/] and \x1b]0;pwned\x07 here.", "en"),
        ("b." * 1000, KEPT, "en"),  # kept, and so named by its duplicate
        ("j-dup-of-long", KEPT, "en"),
    ]


LONG_ID = "a." * 500_000  # 1 MB of what made secret masking quadratic
HOSTILE_ID = "esc-[bold red]x[/]\x1b]0;pwned\x07\x9b31m"
KEPT = GOOD + " The bread is still warm when the first customers arrive, and the queue reaches the corner."


def run(tmp_path, bad_inputs, name="out", overrides=()):
    junk = tmp_path / "inputs" / "junk.jsonl"
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_text("".join(json.dumps({"id": i, "text": t, "lang": lg}) + "\n" for i, t, lg in junk_records()))
    bad_inputs(tmp_path / "inputs" / "bad.jsonl")
    cfg = load_config(
        PrepareConfig,
        REPO / "configs/data/demo.yaml",
        [
            "filters.languages.en.max_words=400",
            "filters.languages.en.max_char_rep=0.2",
            "dropped_text_chars=120",
            *overrides,
        ],
    )
    cfg.sources += [SourceConfig(path=str(junk)), SourceConfig(path=str(tmp_path / "inputs" / "bad.jsonl"))]
    out = tmp_path / name
    run_all(cfg, out)
    return cfg, out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from tests.support.bad_inputs import write_bad_inputs

    tmp = tmp_path_factory.mktemp("droplog")
    return run(tmp, write_bad_inputs)


def all_rows(folder: Path) -> list[dict]:
    """Every row of a Parquet folder, files in name order."""
    return [r for f in sorted(folder.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_every_drop_has_a_row_that_matches_the_ledger(prepared):
    cfg, out = prepared
    m = load_manifest(out)
    langs = m["languages"]
    assert check_dropped(out, langs) == []
    got = dropped_counts(out)
    assert m["dropped"]["rows"] == sum(n for o in got.values() for r in o.values() for n in r.values())
    reasons = {(o, r) for lg in got.values() for o, rs in lg.items() for r in rs}
    for want in [
        ("filtered", r)
        for r in (
            "too_few_words",
            "too_many_words",
            "char_repetition",
            "word_repetition",
            "special_characters",
            "flagged_words",
            "too_short",
            "long_lines",
            "lang_mismatch",
        )
    ] + [("duplicates", "exact"), ("duplicates", "near"), ("errors", "malformed_json"), ("errors", "invalid_unicode")]:
        assert want in reasons, want
    rows = {r["id"]: r for r in all_rows(out / "dropped") if r["id"]}
    assert rows["j-char"]["reason"] == "char_repetition" and rows["j-char"]["stage"] == "quality"
    assert rows["j-char"]["score"] > rows["j-char"]["threshold"] == pytest.approx(0.2)
    assert rows["j-char"]["source"].endswith("junk.jsonl:3") and rows["j-char"]["text"] == ("buy now " * 40)[:120]
    assert rows["j-few"]["score"] == 3 and rows["j-few"]["threshold"] == 20
    assert rows["j-mismatch"]["stage"] == "langid" and rows["j-mismatch"]["score"] >= rows["j-mismatch"]["threshold"]
    # duplicates name the kept document they duplicate (the sample corpus' first English one)
    assert rows["j-exact"]["duplicate_of"] == "en-sample-0001" and rows["j-exact"]["reason"] == "exact"
    assert rows["j-near"]["duplicate_of"] == "en-sample-0001" and rows["j-near"]["score"] >= 0.8
    # a record that could not be read: its place and reason, and the first characters of its raw line
    errors = [r for r in all_rows(out / "dropped") if r["reason"] == "malformed_json"]
    assert (
        errors
        and errors[0]["source"].endswith("bad.jsonl:2")
        and errors[0]["text"] == '{"id": "x", "text": "unterminated'
    )
    assert errors[0]["id"] is None
    # a damaged drop log is caught
    bad = out.parent / "damaged"
    shutil.copytree(out, bad)
    f = sorted((bad / "dropped").glob("*.parquet"))[0]
    t = pq.read_table(f)
    pq.write_table(t.slice(1), f)
    assert check_dropped(bad, langs)


def test_a_megabyte_id_is_capped_in_the_drop_log_and_the_report(prepared):
    """One record's 1 MB id stalled every prepare at its end (the filter report's masking, issue
    37): the drop log keeps its first characters and a hash of the whole, and the report the
    prepare flow publishes (masked) is made in seconds."""
    import hashlib
    import time

    from bloomline.secrets import mask_text
    from data_prep.reports.filter_report import report
    from data_prep.storage.droplog import ID_CHARS

    _, out = prepared
    rows = all_rows(out / "dropped")
    (long,) = [r for r in rows if (r["id"] or "").startswith("a.a.")]
    digest = hashlib.sha256(LONG_ID.encode()).hexdigest()[:16]
    assert long["id"] == LONG_ID[: ID_CHARS - 17] + "…" + digest and len(long["id"]) == ID_CHARS
    (dup,) = [r for r in rows if r["id"] == "j-dup-of-long"]
    assert dup["reason"] == "exact" and dup["duplicate_of"].startswith("b.b.") and len(dup["duplicate_of"]) == ID_CHARS
    t0 = time.perf_counter()
    text = mask_text(report(out, examples=10_000))  # as flows/stages/prepare.py publishes it
    assert time.perf_counter() - t0 < 10
    assert f"`{long['id']}`" in text and f"{dup['duplicate_of']}" in text.replace("\\", "")


def test_texts_from_the_data_show_inert_in_the_report_and_the_filters_command(prepared):
    """Ids, sources and texts reach the terminal through ``bloomline filters``: control characters
    shown as escapes, rich markup and Markdown as written."""
    import re

    from typer.testing import CliRunner

    from data_prep.reports.filter_report import report
    from flows.cli.app import app

    _, out = prepared
    (row,) = [r for r in all_rows(out / "dropped") if r["id"] == HOSTILE_ID]  # the log keeps it as read
    control = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
    shown = "`esc-[bold red]x[/]\\x1b]0;pwned\\x07\\x9b31m`"
    text = report(out, lang="en", reason=row["reason"], examples=10_000)
    assert shown in text and not control.search(text)
    res = CliRunner().invoke(
        app, ["filters", str(out), "--lang", "en", "--reason", row["reason"], "--examples", "10000"]
    )
    assert res.exit_code == 0 and shown in res.stdout and not control.search(res.stdout)
    # an error quoting a path of the user's: one line, its markup and escapes inert
    bad = str(out.parent / "no-[bold red]x[/]-\x1b]0;pwned\x07")
    res = CliRunner().invoke(app, ["filters", bad])
    assert res.exit_code == 2 and "no-[bold red]x[/]-\\x1b]0;pwned\\x07" in res.stderr, res.stderr
    assert not control.search(res.stderr)


def test_kept_scores_are_summarised_in_the_manifest(prepared):
    cfg, out = prepared
    st = load_manifest(out)["stages"]["quality"]["kept_scores"]
    en = st["en"]["char_repetition"]
    assert en["threshold"] == pytest.approx(0.2) and en["fails"] == "above"
    assert en["p1"] <= en["p50"] <= en["p99"] <= en["max"] <= 0.2
    assert 0 <= en["near_threshold"] <= en["kept"]
    assert st["en"]["too_few_words"]["min"] >= 20 and st["code-python"]["too_short"]["min"] >= 100
    assert st == kept_stats(out, cfg.filters)


def test_kept_stats_stream_to_what_the_whole_table_gives(prepared):
    """Streamed in batches of 7 rows (many passes, many batches) and held none in memory, or held
    all in memory, the statistics equal numpy's over each language's whole column; what_if
    streamed equals what_if in one batch."""
    from data_prep.reports.filter_report import what_if
    from data_prep.reports.kept_scores import QUANTILES, checks_of

    cfg, out = prepared
    t = pa.concat_tables([pq.read_table(f) for f in sorted((out / "scores").glob("*.parquet"))])
    streamed = kept_stats(out, cfg.filters, batch_rows=7, held_values=0)
    assert streamed == kept_stats(out, cfg.filters)
    langs = np.array(t.column("lang").to_pylist(), dtype=object)
    kept = np.array([r is None for r in t.column("reason").to_pylist()])
    for lang in sorted(set(langs.tolist())):
        checks, _ = checks_of(lang, cfg.filters)
        for reason, score in ((c.reason, c.score) for c in checks):
            v = t.column(score).to_numpy(zero_copy_only=False).astype(float)[(langs == lang) & kept]
            v = v[~np.isnan(v)]
            if not len(v):
                assert reason not in streamed.get(lang, {})
                continue
            st = streamed[lang][reason]
            q = np.quantile(v, QUANTILES)
            assert [st[f"p{round(p * 100)}"] for p in QUANTILES] == [round(float(x), 6) for x in q], (lang, reason)
            assert (st["min"], st["max"], st["kept"]) == (round(float(v.min()), 6), round(float(v.max()), 6), len(v))
    change = parse_set(["en.max_char_rep=0.3", "fr.max_special=0.2", "code.min_chars=5"], cfg.filters)
    assert what_if(out, change, batch_rows=3) == what_if(out, change)


def test_what_if_agrees_exactly_with_a_rerun(prepared, tmp_path, bad_inputs):
    cfg, out = prepared
    # en looser (j-char then fails the next check, word_repetition), fr stricter, code looser
    change = ["en.max_char_rep=0.3", "fr.max_special=0.2", "code.min_chars=5"]
    # the recorded decisions are what decide() gives under the run's own thresholds
    from data_prep.reports.kept_scores import by_language, checks_of, decide, score_batches

    for batch in score_batches(out, batch_rows=50):
        for lang, s in by_language(batch):
            assert list(decide(s, *checks_of(lang, cfg.filters))) == list(s["reason"]), lang
    table = what_if(out, parse_set(change, cfg.filters))
    assert set(table) >= {"en", "fr", "code-python"}
    assert table["fr"]["lost"] >= 1 and table["code-python"]["gained"] == 1
    assert table["en"]["dropped_by_reason"]["word_repetition"] == 2  # j-word and j-char
    tok = str(out / "tokenizer" / "tokenizer.model")
    _, again = run(
        tmp_path,
        bad_inputs,
        "again",
        [
            "filters.languages.en.max_char_rep=0.3",
            "filters.languages.fr.max_special=0.2",
            "filters.code.min_chars=5",
            f"tokenizer.model={tok}",
        ],
    )
    ledger = load_manifest(again)["languages"]
    before = load_manifest(out)["languages"]
    quality = {
        "too_few_words",
        "too_many_words",
        "char_repetition",
        "word_repetition",
        "special_characters",
        "flagged_words",
        "too_short",
        "long_lines",
    }
    for lang, e in ledger.items():
        rerun = {k: v for k, v in e["filtered"].items() if k in quality}
        if lang in table:
            assert table[lang]["dropped_by_reason"] == rerun, lang
        else:
            assert rerun == {k: v for k, v in before[lang]["filtered"].items() if k in quality}, lang


def test_report_and_its_refusals(prepared):
    from data_prep.reports.filter_report import report

    _, out = prepared
    text = report(out, lang="en", examples=2, sets=["en.max_char_rep=0.5"])
    assert "### en (English)" in text and "**filtered:char_repetition**: " in text
    assert "`j-char`" in text and "score " in text and "## Kept documents near a threshold" in text
    assert "## What if: en.max_char_rep=0.5" in text and "| en |" in text
    assert "### fr" not in text  # --lang en
    with pytest.raises(Exception, match="shapes the recorded scores"):
        report(out, sets=["en.char_rep_n=5"])
    with pytest.raises(ConfigError, match="is not a number"):
        report(out, sets=["en.max_char_rep=abc"])
    with pytest.raises(Exception, match="no field"):
        report(out, sets=["en.max_nonsense=1"])
    with pytest.raises(DataError, match="not one of BLOOM's languages"):
        report(out, lang="klingon")


def test_the_report_reads_the_kept_score_statistics_the_manifest_holds(prepared, tmp_path):
    """Not computed a second time (the prepare flow writes the report after the manifest): a value
    planted in a copy's manifest is the one the report shows."""
    from data_prep.reports.filter_report import report

    _, out = prepared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["stages"]["quality"]["kept_scores"]["en"]["char_repetition"]["p50"] = 0.123456
    (copy / "manifest.json").write_text(json.dumps(m))
    assert "| en | char_repetition | above 0.2 |" in report(out)
    assert "| 0.1235 |" in report(copy, lang="en").split("| en | char_repetition |")[1].splitlines()[0]


def test_filters_command(prepared):
    import subprocess
    import sys

    _, out = prepared
    cmd = [
        sys.executable,
        "-m",
        "flows.cli.app",
        "filters",
        str(out),
        "--reason",
        "char_repetition",
        "--examples",
        "1",
        "--set",
        "en.max_char_rep=0.3",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "**filtered:char_repetition**" in res.stdout and "too_few_words" not in res.stdout.split("## Kept")[0]
    assert "## What if: en.max_char_rep=0.3" in res.stdout
    thresholds = res.stdout.split("## Thresholds")[1].split("##")[0]  # which languages have their own
    assert "- fitted (the recipe's `filters.languages`): " in thresholds and " en" in thresholds.split("ROOTS")[0]
    bad = subprocess.run(cmd[:5] + ["--set", "en.max_char_rep"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "error:" in bad.stderr and "LANG.FIELD=VALUE" in bad.stderr


def test_drop_examples_stream_the_first_rows_of_each_group(prepared):
    from data_prep.reports.filter_report import drop_examples

    _, out = prepared
    rows = all_rows(out / "dropped")
    counts = dropped_counts(out)
    ex = drop_examples(out, n=2)
    for lang, groups in ex.items():
        for key, e in groups.items():
            outcome, reason = key.split(":")
            assert e["count"] == counts[lang][outcome][reason]
            want = [r for r in rows if (r["lang"], r["outcome"], r["reason"]) == (lang, outcome, reason)][:2]
            assert e["examples"] == want
    only = drop_examples(out, lang="en", reason="exact", n=5)
    assert list(only) == ["en"] and list(only["en"]) == ["duplicates:exact"]
