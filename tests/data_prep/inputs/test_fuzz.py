"""Property-based fuzzing of every reader and per-document step with Hypothesis (strategies in
bench/fuzz.py, whose long run tries 100,000 records): whatever the input, ``prepare`` never
raises, every record is booked exactly once, the drop log equals the ledger, and a clean file's
documents are kept as they would be alone. Deterministic (derandomized) and few examples in CI."""

import json
import tempfile
from functools import lru_cache
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bloomline.config import load_config
from bloomline.errors import BloomlineError
from data_prep.config import PrepareConfig, SourceConfig
from data_prep.passes.chunks import chunk_table, process_chunk
from data_prep.storage.droplog import drop_counts
from data_prep.storage.workdir import Paths
from tests.support.fuzz_inputs import (
    MAX_DOC_BYTES,
    STREAM_COMPRESSIONS,
    cut_gzip,
    gzip_prefix_records,
    hostile_text,
    jsonl_bytes,
    lines,
    overrides,
    records_in,
    tables,
    write_saved_dataset,
)

REPO = Path(__file__).resolve().parents[3]
CLEAN = REPO / "data_prep/sample_corpus/text/en.jsonl"


def ci(examples: int) -> settings:
    """Deterministic (derandomized), few examples, no example database: the same inputs every CI run."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


def config(*sources: Path) -> PrepareConfig:
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [f"read.max_doc_bytes={MAX_DOC_BYTES}"])
    cfg.sources = [SourceConfig(path=str(s)) for s in sources]
    return cfg


def chunk_stage(cfg: PrepareConfig, out: Path) -> tuple[list[dict], dict]:
    """The chunks pass over every input of ``cfg`` (in process): each chunk's summary; the chunks' ledger."""
    from data_prep.pipeline import plan
    from data_prep.steps.document import Ledger

    summaries = [process_chunk(c, cfg, str(out)) for c in plan(cfg, Paths(out))["chunks"]]  # bundles too
    ledger = Ledger()
    for s in summaries:
        ledger.merge(s["ledger"])
    return summaries, ledger


def booked_as_dropped(ledger) -> dict:
    return {
        (lang, k, r): n
        for lang, e in ledger.to_dict().items()
        for k in ("filtered", "errors")
        for r, n in e[k].items()
        if n
    }


def kept_texts(out: Path, summaries: list[dict], path: Path) -> list[tuple[str, str]]:
    """The documents the chunks pass kept of input file ``path`` (whichever chunk read it)."""
    rows = []
    for s in summaries:
        t = chunk_table(Paths(out), s["id"], ["id", "loc", "text"])
        rows += [
            (i, x)
            for i, loc, x in zip(*(t.column(c).to_pylist() for c in ("id", "loc", "text")))
            if loc.startswith(f"{path}:")
        ]
    return rows


@lru_cache(maxsize=1)
def clean_alone() -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "in").mkdir()
        f = Path(d) / "in" / "b-clean.jsonl"
        f.write_bytes(CLEAN.read_bytes())
        summaries, _ = chunk_stage(config(f), Path(d) / "out")
        return [(i, x) for i, x in kept_texts(Path(d) / "out", summaries, f)]


@ci(25)
@given(st.lists(lines(), max_size=40))
def test_hostile_jsonl_every_line_booked_once_nothing_raised(ls):
    data = jsonl_bytes(ls)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "in").mkdir()
        (d / "in" / "a-hostile.jsonl").write_bytes(data)
        (d / "in" / "b-clean.jsonl").write_bytes(CLEAN.read_bytes())  # after it: its chunk comes second
        summaries, ledger = chunk_stage(config(d / "in"), d / "out")
        assert ledger.totals()["docs_in"] == records_in(data) + records_in(CLEAN.read_bytes())
        assert sum(s["steps"]["read"]["records"] for s in summaries) == ledger.totals()["docs_in"]
        assert dict(drop_counts(d / "out" / "dropped")) == booked_as_dropped(ledger)
        # the clean file's documents are kept exactly as they are alone (its ids and texts)
        assert kept_texts(d / "out", summaries, d / "in" / "b-clean.jsonl") == clean_alone()


@ci(15)
@given(tables(), st.booleans())
def test_hostile_parquet_every_row_booked_once_nothing_raised(table_and_groups, store_schema):
    """Without pyarrow's stored schema a dictionary column comes back a dictionary only because the
    reader asks for one (data_prep/inputs/table_reader.py)."""
    table, groups = table_and_groups
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "t.parquet"
        pq.write_table(table, f, row_group_size=max(1, table.num_rows // groups), store_schema=store_schema)
        summaries, ledger = chunk_stage(config(f), Path(d) / "out")
        assert ledger.totals().get("docs_in", 0) == table.num_rows
        assert dict(drop_counts(Path(d) / "out" / "dropped")) == booked_as_dropped(ledger)


@ci(10)
@given(tables(), st.sampled_from(STREAM_COMPRESSIONS))
def test_hostile_arrow_streams_every_row_booked_once_nothing_raised(table_and_groups, compression):
    """The same tables as saved datasets (Arrow streams keep their dictionaries), their buffers
    compressed or not."""
    table, _ = table_and_groups
    with tempfile.TemporaryDirectory() as d:
        write_saved_dataset(Path(d) / "ds", table, compression)
        summaries, ledger = chunk_stage(config(Path(d) / "ds"), Path(d) / "out")
        assert ledger.totals().get("docs_in", 0) == table.num_rows
        assert dict(drop_counts(Path(d) / "out" / "dropped")) == booked_as_dropped(ledger)


@ci(15)
@given(cut_gzip())
def test_a_gzip_cut_anywhere_books_its_whole_lines_and_the_break(data_and_cut):
    data, cut = data_and_cut
    whole_lines, whole = gzip_prefix_records(data, cut)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "c.jsonl.gz"
        f.write_bytes(cut)
        summaries, ledger = chunk_stage(config(f), Path(d) / "out")
        errors = ledger.to_dict().get("_unknown", {}).get("errors", {})
        breaks = errors.get("truncated_gzip", 0) + errors.get("corrupt_gzip", 0)
        assert (breaks, ledger.totals().get("docs_in", 0)) == ((0, whole_lines) if whole else (1, whole_lines + 1))


@ci(60)
@given(st.lists(overrides(), min_size=1, max_size=3))
def test_hostile_overrides_are_refused_in_one_error_or_taken(items):
    """Anything else than a BloomlineError (the CLI's one-line error, exit 2) would be a traceback."""
    try:
        load_config(PrepareConfig, REPO / "configs/data/demo.yaml", items)
    except BloomlineError:
        pass


@ci(2)
@given(st.lists(lines(), min_size=20, max_size=60))
def test_the_whole_prepare_never_raises_and_books_every_line(ls):
    """Read to shards (dedup, tokenizer, PII, tokenize, pack too): the manifest's ledger counts
    every line, and its drop log equals its ledger (the manifest pass refuses to finish otherwise)."""
    from data_prep.pipeline import run_all

    data = jsonl_bytes(ls)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "in").mkdir()
        (d / "in" / "hostile.jsonl").write_bytes(data)
        clean = 0
        for lang in ("en", "sw"):
            f = REPO / f"data_prep/sample_corpus/text/{lang}.jsonl"
            (d / "in" / f.name).write_bytes(f.read_bytes())
            clean += records_in(f.read_bytes())
        cfg = config(d / "in")
        cfg.tokenizer.vocab_size = 1000
        m = run_all(cfg, d / "out")
        assert m["totals"]["input_records"] == records_in(data) + clean


@ci(200)
@given(st.lists(st.sampled_from(["", "x", " "]) | hostile_text, max_size=4).map("".join))
def test_hostile_text_reaches_a_terminal_inert_and_a_secret_beside_it_is_masked(text):
    """What a file holds is shown with its control characters as escapes and its rich markup as
    written (bloomline/terminal.py), and masking a secret beside it is not thrown off by it."""
    import re

    from rich.text import Text

    from bloomline.secrets import MASK, mask_text
    from bloomline.terminal import printable, rich_escape

    shown = printable(text)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown)
    assert Text.from_markup(rich_escape(text), emoji=False).plain == shown
    assert mask_text(f"{text} tcp://u:fz-s3cr3t@h:1", env={}).endswith(f" tcp://u:{MASK}@h:1")


def on_store(s3, local: Path) -> str:
    """``local`` (a file or folder) copied to a fresh prefix of the loopback S3 server; its URL."""
    import uuid

    url = f"s3://{s3.bucket}/fuzz/{uuid.uuid4().hex}/{local.name}"
    s3.fs().put(str(local), url, recursive=local.is_dir())
    return url


def on_the_store(examples: int) -> settings:
    """:func:`ci`, with the server fixture (one for the session) and no shrinking (slow over HTTP)."""
    return settings(
        ci(examples),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[*ci(examples).suppress_health_check, HealthCheck.function_scoped_fixture],
    )


@on_the_store(2)
@given(st.lists(lines(), max_size=40), tables(), cut_gzip())
def test_the_readers_properties_hold_on_an_object_store(s3, ls, table_and_groups, data_and_cut):
    """The properties above with the inputs read from S3 (tests/support/s3.py), a few examples: a
    JSONL folder (a prefix URL without a slash, listed as on disk), Parquet, a saved dataset and a
    gzip cut anywhere, each booked as from a local file."""
    table, groups = table_and_groups
    gz, cut = data_and_cut
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "in").mkdir()
        (d / "in" / "a-hostile.jsonl").write_bytes(jsonl_bytes(ls))
        (d / "in" / "b-clean.jsonl").write_bytes(CLEAN.read_bytes())
        pq.write_table(table, d / "t.parquet", row_group_size=max(1, table.num_rows // groups))
        write_saved_dataset(d / "ds", table, None)
        (d / "c.jsonl.gz").write_bytes(cut)
        for name in ("in", "t.parquet", "ds", "c.jsonl.gz"):
            local_sums, local_ledger = chunk_stage(config(d / name), d / f"out-{name}")
            url = on_store(s3, d / name)
            sums, ledger = chunk_stage(config(url), d / f"s3-{name}")
            # the same counts; the examples name where they were read
            assert json.dumps(ledger.to_dict()).replace(url, str(d / name)) == json.dumps(local_ledger.to_dict())
            assert dict(drop_counts(d / f"s3-{name}" / "dropped")) == booked_as_dropped(ledger)
            if name == "in":
                assert kept_texts(d / f"s3-{name}", sums, url + "/b-clean.jsonl") == clean_alone()
