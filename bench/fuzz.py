"""The long fuzz run of ``prepare``: hostile inputs (tests/support/fuzz_inputs.py) at length, counting what breaks.

    python -m bench.fuzz [--records 100000] [--seed 0] [--work DIR]

The long run draws files of hostile lines until ``--records`` records are generated (plus some
Parquet files and cut gzip streams), mixes in a clean file from the sample corpus, runs the whole
``prepare`` over them (read, normalize, language ID, quality, dedup, tokenizer, PII, tokenize,
pack: ``data_prep.pipeline.run_all``) and the filter report, and checks the properties: it never
raises; every non-blank line and every row is booked exactly once (the ledger's records equal the
input's, a cut gzip's counted as its whole lines before the cut plus one error for the break); the
drop log equals the ledger; the clean file's kept documents are the same as when it is prepared
alone; the searches over whatever a file holds (masking, PII, terminal escaping) take seconds,
not hours, on a megabyte of each :func:`hostile_runs` shape. It prints how many inputs were tried
and what was found.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.repo import REPO
from tests.support.fuzz_inputs import (
    MAX_DOC_BYTES,
    STREAM_COMPRESSIONS,
    cut_gzip,
    dictionary_bomb,
    gzip_prefix_records,
    hostile_runs,
    jsonl_bytes,
    lines,
    records_in,
    tables,
    write_saved_dataset,
)


# ------------------------------------------------------------------------------------ the long run
def _draw_many(strategy: Any, n: int, seed: int) -> list[Any]:
    """``n`` examples of ``strategy``, reproducible from ``seed`` (Hypothesis drives the drawing)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out: list[Any] = []

    @hseed(seed)
    @settings(
        max_examples=n, phases=[Phase.generate], database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def collect(x: Any) -> None:
        out.append(x)

    collect()
    return out


def main() -> int:
    import pyarrow.parquet as pq

    from bloomline.config import load_config
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import run_all

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bloomline-fuzz"))
    args = ap.parse_args()
    import shutil

    shutil.rmtree(args.work, ignore_errors=True)
    inputs = args.work / "inputs"
    inputs.mkdir(parents=True)
    t0 = time.perf_counter()
    per_file = 2000
    expected = 0
    files = 0
    rng = random.Random(args.seed)
    while expected < args.records:
        batch = _draw_many(lines(), per_file, rng.randrange(2**31))
        data = jsonl_bytes(batch)
        (inputs / f"hostile-{files:04d}.jsonl").write_bytes(data)
        expected += records_in(data)
        files += 1
    n_jsonl = expected
    tabs = _draw_many(tables(), 200, rng.randrange(2**31))
    datasets = args.work / "datasets"  # saved datasets, each its own source (Arrow streams)
    bomb = dictionary_bomb(MAX_DOC_BYTES + 1, 1024, [])
    for i, (t, groups) in enumerate([*tabs, (bomb, 1)]):
        # half without pyarrow's stored schema: dictionary columns are then read as dictionaries by request
        pq.write_table(
            t,
            inputs / f"hostile-{i:04d}.parquet",
            row_group_size=max(1, t.num_rows // groups or 1),
            store_schema=bool(i % 2),
        )
        write_saved_dataset(datasets / f"hostile-{i:04d}", t, STREAM_COMPRESSIONS[i % len(STREAM_COMPRESSIONS)])
        expected += 2 * t.num_rows  # every row is a record, whatever its columns
    cuts = _draw_many(cut_gzip(), 200, rng.randrange(2**31))
    for i, (data, cut) in enumerate(cuts):
        (inputs / f"cut-{i:04d}.jsonl.gz").write_bytes(cut)
        whole_lines, whole = gzip_prefix_records(data, cut)
        expected += whole_lines + (0 if whole else 1)
    gen_s = time.perf_counter() - t0
    clean = REPO / "data_prep/sample_corpus/text/en.jsonl"
    shutil.copy(clean, inputs / "clean-en.jsonl")
    expected += records_in(clean.read_bytes())
    print(
        f"generated {n_jsonl:,} JSONL records in {files} files, {len(tabs)} tables as Parquet and as Arrow streams "
        f"({sum(t.num_rows for t, _ in tabs):,} rows each way) and a dictionary bomb, {len(cuts)} gzip streams cut "
        f"anywhere, in {gen_s:.0f} s; "
        f"{expected:,} records in all"
    )

    base = ["langid.enabled=true", f"read.max_doc_bytes={MAX_DOC_BYTES}", "keep_work=true", "tokenizer.vocab_size=2000"]
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", base)
    cfg.sources = [SourceConfig(path=str(inputs)), *(SourceConfig(path=str(d)) for d in sorted(datasets.iterdir()))]
    crashes, found = [], {}
    t1 = time.perf_counter()
    try:
        m = run_all(cfg, args.work / "out")
    except Exception as e:  # noqa: BLE001 - what the fuzz run is here to find
        crashes.append(f"{type(e).__name__}: {str(e)[:300]}")
        m = None
    run_s = time.perf_counter() - t1
    if m is not None:  # the report flows/stages/prepare.py publishes: every drop's id, source and text, masked
        from bloomline.secrets import mask_text
        from data_prep.reports.filter_report import report

        t2 = time.perf_counter()
        try:
            mask_text(report(args.work / "out"))
        except Exception as e:  # noqa: BLE001 - what the fuzz run is here to find
            crashes.append(f"filter report: {type(e).__name__}: {str(e)[:300]}")
        print(f"the filter report, masked: {time.perf_counter() - t2:.1f} s")
    unbooked = None
    if m is not None:
        unbooked = expected - m["totals"]["input_records"]
        for e in m["languages"].values():
            for reason, n in e.get("errors", {}).items():
                found[reason] = found.get(reason, 0) + n
    print(f"prepare over them: {run_s:.0f} s, crashes: {len(crashes)}{': ' + crashes[0] if crashes else ''}")
    if m is not None:
        print(
            f"records booked: {m['totals']['input_records']:,} of {expected:,} (unbooked: {unbooked}); kept "
            f"{m['totals']['docs_kept']:,}; the drop log equals the ledger (checked by the manifest pass)"
        )
        print(
            "errors booked by reason: "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(found.items(), key=lambda kv: -kv[1]))
        )
        same = clean_docs_unchanged(cfg, inputs / "clean-en.jsonl", args.work)
        print(
            f"the clean file's kept documents, prepared with the hostile ones and alone: {'the same' if same else 'DIFFERENT'}"
        )
    took = hostile_search_seconds(1 << 20)
    worst = max(took, key=took.get)
    print(f"searches over a file's text, 1 MiB of each hostile shape: slowest {worst} {took[worst]:.2f} s")
    return 1 if crashes or unbooked or took[worst] > SEARCH_S else 0


SEARCH_S = 5.0
"""Seconds one search may take over 1 MiB of a hostile shape. The linear ones take about a second
at most on a loaded core (PII on dense ``@`` or ``:``); a quadratic one takes minutes to hours
(the URL pattern before issue 37: 40k characters 6.8 s)."""


def hostile_search_seconds(size: int) -> dict[str, float]:
    """Seconds on each :func:`hostile_runs` shape of ``size`` characters, per search that runs over
    whatever a file holds (``shape/search``): secret masking, PII redaction, terminal escaping."""
    from bloomline.secrets import mask_text
    from bloomline.terminal import printable
    from data_prep.steps.pii import redact

    searches = {"mask": lambda t: mask_text(t, env={}), "pii": redact, "printable": printable}
    out = {}
    for name, text in hostile_runs(size).items():
        for what, search in searches.items():
            t0 = time.perf_counter()
            search(text)
            out[f"{name}/{what}"] = time.perf_counter() - t0
    return out


def clean_docs_unchanged(cfg: Any, clean: Path, work: Path) -> bool:
    """Whether the chunks pass kept the same documents of the clean file beside the hostile inputs
    as alone (whichever chunk or bundle read it)."""
    import copy

    from bloomline.io import read_json
    from data_prep.config import SourceConfig
    from data_prep.passes.chunks import chunk_table
    from data_prep.pipeline import run_all
    from data_prep.storage.workdir import Paths

    def kept(out: Path, path: Path) -> list[tuple[str, str]]:
        paths = Paths(out)
        rows = []
        for c in read_json(paths.work / "plan.json")["chunks"]:
            t = chunk_table(paths, c["id"], ["id", "loc", "text"])
            rows += [
                (i, x)
                for i, loc, x in zip(*(t.column(k).to_pylist() for k in ("id", "loc", "text")))
                if loc.startswith(f"{path}:")
            ]
        return rows

    alone = copy.deepcopy(cfg)
    alone.sources = [SourceConfig(path=str(clean))]
    run_all(alone, work / "clean-alone")
    return kept(work / "out", clean) == kept(work / "clean-alone", clean)


if __name__ == "__main__":
    sys.exit(main())
