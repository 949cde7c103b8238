"""An evaluated run made without training: :func:`make_run` writes the contract files of a run
whose three checkpoints were evaluated on prepared data (the results tables, generations, metrics
log and a ``bloomline.json`` pointing at the data), with swahili regressing at the last. For the
tests that read evaluated runs: the dashboard's (tests/eval/pages/test_dashboard.py), a reference
run of the evaluation-driven mixture (tests/eval/results/test_reference.py, the CLI's tests)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from bloomline.config import load_config
from bloomline.io import sha256_file
from eval.results.metrics import LangTotals, metric_rows
from eval.results.rows import long_rows
from eval.results.table import write_results
from tests.support import REPO
from training.checkpoint.meta import make_meta
from training.config import TrainRecipe


def task_rows(step: int, langs: list[str], note: str = "fewer than 4 windows of 48 tokens") -> list[dict]:
    """continuation rows of one checkpoint: swahili's accuracy rises with the step, far above
    chance; every other language sits at chance; yoruba was not evaluated (``note``)."""
    from eval.tasks.base import Row, skipped, with_means

    rows = [Row(l, "acc", 0.25 + (0.5 * step / 300 if l == "sw" else 0.0), 0.02, 200) for l in langs if l != "yo"]
    return [r.to_dict("continuation") for r in with_means(rows) + [skipped("yo", note)]]


def make_run(
    run: Path,
    demo: Path,
    gens: list[tuple[str, str]] = (("Habari za", "asubuhi"),),
    tasks: bool = False,
    note: str = "fewer than 4 windows of 48 tokens",
) -> None:
    """Three evaluated checkpoints of a run (swahili regresses at the last), its metrics, swahili
    generations (``gens``: prompt, completion) and a bloomline.json that points at the prepared
    data ``demo`` (whose ledger and drop log the dashboard shows)."""
    manifest = json.loads((demo / "manifest.json").read_text())
    langs = sorted(l for l in manifest["languages"] if l != "_unknown")  # every language the data has
    for step in (100, 200, 300):
        per = {
            l: LangTotals(
                nll=1000.0 * (1 - step / 1000),
                tokens=400,
                text_nll=900.0 * (1 - step / 1000) * (1.3 if (l == "sw" and step == 300) else 1.0),
                bytes=1200,
                docs=3,
            )
            for l in langs
        }
        ident = {
            "run": run.name,
            "step": step,
            "checkpoint": str(run / f"checkpoints/step_{step}"),
            "precision": "fp32",
            "layout": "tp=1 pp=1 dp=1 zero_stage=1",
            "data_manifest_sha256": "a" * 64,
            "evaluated_at": datetime.now(timezone.utc),
        }
        rows = [
            {
                "run": run.name,
                "step": step,
                "lang": "sw",
                "k": k,
                "prompt": p,
                "completion": f"{c} {step}",
                "precision": "fp32",
                "evaluated_at": ident["evaluated_at"],
            }
            for k, (p, c) in enumerate(gens)
        ]
        extra = [{**ident, **r, "tokens_seen": 0} for r in task_rows(step, langs, note)] if tasks else []
        write_results(
            run,
            step,
            long_rows([{**ident, **r} for r in metric_rows(per, {l: 10 * step for l in langs})]) + extra,
            rows,
        )
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 8 - s / 100, "lr": 1e-4 * min(1, s / 50)}) + "\n" for s in range(1, 301))
    )
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    step = run / "checkpoints" / "step_300"
    step.mkdir(parents=True)
    sampler = {"version": 2, "seed": 1, "step": 300, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    (step / "bloomline.json").write_text(
        json.dumps(
            make_meta(
                300,
                r,
                demo,
                sha256_file(demo / "manifest.json"),
                sampler,
                {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None},
            )
        )
    )
    (run / "checkpoints" / "latest").write_text("step_300")
