"""The commands around the jobs: ``export`` a checkpoint, the ``dashboard`` of a run, the
``filters`` report of prepared data, the ``plan`` of a layout, and ``serve`` (a Prefect server
with the jobs as deployments)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from bloomline.errors import BloomlineError
from flows.cli.base import Debug, console, local_out, no_credentials, overrides, run_command
from flows.config import BLOOM_DATA_RECIPE, DEFAULT_RECIPES
from training.planning.planner import DEVICES


def export(
    checkpoint: str = typer.Option(
        ...,
        "--checkpoint",
        help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout, or its URL (a checkpoint.mirror's).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Folder for the Hugging Face model (safetensors, config.json, tokenizer)."
    ),
    data: str = typer.Option(
        None,
        "--data",
        help="The run's prepared data, for its tokenizer, local or at a URL (default: the checkpoint's data_dir).",
    ),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    debug: Debug = False,
) -> None:
    """Export a checkpoint of any layout as a Hugging Face BloomForCausalLM with its tokenizer."""

    def body() -> None:
        from flows.config import EXPORT_DTYPES

        no_credentials(checkpoint=checkpoint, data=data)
        local_out(out, "export to a local folder, then copy it (huggingface-cli upload, aws s3 sync)")
        if dtype not in EXPORT_DTYPES:
            raise BloomlineError(f"--dtype {dtype}: use {' or '.join(EXPORT_DTYPES)}")
        from training.hf.to_hf import export as run_export

        path = run_export(checkpoint, out, data, dtype)
        console.print(
            f"[bold green]done[/]: {path} (AutoModelForCausalLM.from_pretrained and AutoTokenizer load it offline)"
        )

    run_command(body, debug, driver=True, out=out)


def dashboard(
    runs: List[Path] = typer.Argument(
        ...,
        help="A run folder (bloomline train --out) with evaluation results; or several, compared side by side, the "
        "first as the base (an evaluated published model's --out is one too).",
    ),
    out: Path = typer.Option(Path("compare.html"), "--out", help="With several runs: where the comparison page goes."),
    debug: Debug = False,
) -> None:
    """Write RUN_DIR/dashboard/index.html, or with several runs one page comparing them: self-contained, works
    offline from file://."""

    def body() -> None:
        for run in runs:
            if not run.is_dir():
                raise BloomlineError(f"{run} is not a folder")
        if len(runs) == 1:
            from eval.pages.dashboard import build

            console.print(f"[bold green]done[/]: {build(runs[0])}")
            return
        from eval.pages.compare import compare

        console.print(f"[bold green]done[/]: {compare(runs, out)}")

    run_command(body, debug)


def filters(
    data: str = typer.Argument(
        ...,
        help="A prepared data folder (bloomline prepare --out), local or at a URL; with --derive, a clean corpus "
        "(a folder of JSONL records with text, lang and, where known, source).",
    ),
    lang: str = typer.Option(None, "--lang", help="Only this language."),
    reason: str = typer.Option(None, "--reason", help="Only this drop reason (e.g. char_repetition)."),
    examples: int = typer.Option(3, "--examples", help="Example texts per language and reason."),
    set_: List[str] = typer.Option([], "--set", help="What if: LANG.FIELD=VALUE (or defaults./code.), repeatable."),
    derive: bool = typer.Option(
        False,
        "--derive",
        help="Derive each language's thresholds from the clean corpus DATA and print them as a recipe's "
        "filters.languages (give them to prepare as -o filters.languages=@FILE), after what each source "
        "loses under thresholds derived from the others (on stderr).",
    ),
    config: Path = typer.Option(
        BLOOM_DATA_RECIPE, "--config", help="With --derive: the recipe whose n-gram sizes and defaults apply."
    ),
    debug: Debug = False,
) -> None:
    """Why documents were dropped, per language and reason, with examples; how close kept documents
    sit to each threshold; and what proposed thresholds would keep or lose (from the recorded
    scores, without preparing again). Prints Markdown. With --derive, the thresholds of a clean corpus."""

    def body() -> None:
        no_credentials(data=data)
        if derive:
            import contextlib
            import sys

            from data_prep.calibration.filter_defaults import run

            root = Path(data)
            with contextlib.redirect_stdout(sys.stderr):  # the report; the thresholds alone on stdout
                run(config, [], root, derive=False)
            print(f"# filters.languages derived from {data} (bloomline filters --derive): -o filters.languages=@FILE")
            run(config, [], root, derive=True)
            return
        from data_prep.reports.filter_report import report

        print(report(data, lang, reason, examples, set_), end="")

    run_command(body, debug)


def plan(
    config: Path = typer.Option(
        DEFAULT_RECIPES["train"],
        "--config",
        help="Training recipe (configs/train/) or pipeline recipe (configs/pipeline/).",
    ),
    gpu: str = typer.Option("a100-80gb", "--gpu", help=f"{', '.join(DEVICES)}, or cpu (this machine)."),
    nodes: int = typer.Option(None, "--nodes", help="Plan on N nodes: DP becomes N·devices-per-node/(TP·PP)."),
    iteration_seconds: float = typer.Option(
        None, "--iteration-seconds", help="A measured iteration time: gives TFLOP/s per GPU."
    ),
    offload: bool = typer.Option(False, "--offload", help="Also plan ZeRO-Offload (optimizer states in CPU memory)."),
    override: List[str] = overrides("parallel.tp=8"),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    debug: Debug = False,
) -> None:
    """Memory per pipeline stage and GPU, FLOPs, bubble and fit of a training layout, before any run."""

    def body() -> None:
        import json

        from flows.cli.layout_plan import layout_plan
        from flows.display.summary import print_plan

        res = layout_plan(config, gpu, nodes, iteration_seconds, offload, override)
        print(json.dumps(res, indent=1)) if as_json else print_plan(res, console)
        if not res["fits"]:
            raise typer.Exit(1)

    run_command(body, debug)


def serve(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Where the started Prefect server listens (loopback by default)."
    ),
    port: int = typer.Option(4200, "--port", help="Its port."),
    api_url: str = typer.Option(
        None,
        "--api-url",
        help="Use this running Prefect server (http://host:4200/api), which must require an auth string, "
        "instead of starting one.",
    ),
    root: List[str] = typer.Option(
        [],
        "--root",
        help="A folder, or a URL prefix (s3://bucket/team), the served runs may read and write (repeatable); "
        "default: the current folder.",
    ),
    debug: Debug = False,
) -> None:
    """Start (or use) a Prefect server that requires an auth string, and serve pipeline, prepare,
    train and evaluate as deployments whose runs use only the --root folders (flows/serve.py)."""

    def say(text: str, warning: bool = False) -> None:  # paths and URLs as given: no rich markup read in them
        console.print(text, style="yellow" if warning else None, markup=False, highlight=False, soft_wrap=True)

    def body() -> None:
        from flows.serve import serve_command, serve_roots

        serve_command(host, port, api_url, serve_roots(root), say)

    run_command(body, debug)
