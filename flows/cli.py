"""The ``bloomline`` command line.

Typer (already a dependency of Prefect) gives typed options and ``--help`` for free. Every
user-facing failure is a one-line ``error: ...`` and exit status 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

# Before Prefect is imported: no network here, and the temporary server must not phone home.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# The temporary server needs 10-20 s on 2 busy cores; Prefect's default of 20 s to come up fails
# runs on a loaded machine for no reason of their own.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

import typer
from rich.console import Console

from bloomline.errors import BloomlineError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_CONFIG = REPO / "configs" / "data" / "demo.yaml"

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="bloomline: multilingual corpora → trained, evaluated BLOOM-style models.")
# Wide enough for the summary table when output goes to a file or CI log.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


@app.callback()
def _root() -> None:
    """bloomline: multilingual corpora → trained, evaluated BLOOM-style models."""


class RichProgress:
    """Progress bars per stage (bytes/s while reading and tokenizing)."""

    def __init__(self) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TransferSpeedColumn)

        self._p = Progress(TextColumn("[bold]{task.description:<14}"), BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), TimeElapsedColumn(), console=console, transient=False)
        self._tasks: dict[str, int] = {}
        self._p.start()

    def start(self, stage: str, total: int, unit: str) -> None:
        self._tasks[stage] = self._p.add_task(stage, total=max(total, 1))

    def advance(self, stage: str, n: int = 1) -> None:
        self._p.advance(self._tasks[stage], n)

    def finish(self, stage: str, message: str) -> None:
        tid = self._tasks.get(stage)
        if tid is not None:
            self._p.update(tid, completed=self._p.tasks[tid].total)
        self._p.console.print(f"[green]✓[/] {stage}: {message}")

    def stop(self) -> None:
        self._p.stop()


@app.command()
def prepare(
    inputs: List[Path] = typer.Argument(None, help="JSONL / JSONL.gz / Parquet files or folders, or saved datasets; replace the config's sources."),
    out: Path = typer.Option(..., "--out", help="Output folder (shards, tokenizer, manifest.json)."),
    config: Path = typer.Option(DEFAULT_DATA_CONFIG, "--config", help="Recipe (YAML)."),
    override: List[str] = typer.Option([], "-o", "--override", help="Override a config value: -o dotted.key=value (repeatable)."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first bad record instead of booking it as an error."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Tokenize and pack multilingual corpora into length-bucketed Arrow shards."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig, SourceConfig

    def body() -> None:
        cfg = load_config(PrepareConfig, config, override)
        if inputs:
            cfg.sources = [SourceConfig(path=str(p.resolve())) for p in inputs]
        if not cfg.sources:
            raise BloomlineError("no inputs: give INPUT arguments or 'sources' in the config")
        from data_prep.readers import discover

        for s in cfg.sources:  # fail on a missing input before any server or cluster starts
            discover(s, check=True)
        from flows.prepare import run_prepare
        from flows.summary import print_summary

        progress = RichProgress()
        try:
            manifest = run_prepare(cfg, str(out), strict=strict, progress=progress)
        finally:
            progress.stop()
        if manifest.get("run_stats", {}).get("already_complete"):
            console.print(f"[green]{out} is already complete[/] (same config and inputs); nothing to do.")
        print_summary(manifest, console)
        console.print(f"[bold green]done[/]: {Path(out) / 'manifest.json'}")

    _run(body, debug)


DEFAULT_TRAIN_CONFIG = REPO / "configs" / "train" / "bloom-tiny.yaml"


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="Folder written by 'bloomline prepare' (manifest.json, shards)."),
    out: Path = typer.Option(..., "--out", help="Run folder: metrics.jsonl, tensorboard/, checkpoints/. Rerun to resume."),
    config: Path = typer.Option(DEFAULT_TRAIN_CONFIG, "--config", help="Training recipe (YAML, configs/train/)."),
    override: List[str] = typer.Option([], "-o", "--override", help="Override a value: -o parallel.tp=2 (repeatable)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Train a BLOOM model on prepared data (ranks started with the DeepSpeed launcher)."""
    from bloomline.config import load_config, to_dict
    from training.config import TrainRecipe

    def body() -> None:
        recipe = load_config(TrainRecipe, config, override)
        from flows.train import validate

        validate(recipe, data)  # before any server, launcher or rank starts
        from flows.train import train as train_flow

        res = train_flow(to_dict(recipe), str(data.resolve()), str(out.resolve()))
        last = res.get("last", {})
        if res["stopped_by_kill_switch"]:
            console.print(f"[yellow]stopped by the kill switch[/] at step {res['step']}: remove {out / 'STOP'} and rerun to continue")
        else:
            console.print(f"[bold green]done[/]: step {res['step']}/{res['steps']}, loss {last.get('loss', float('nan')):.4f} "
                          f"({res['attempts']} attempt(s)); metrics in {out / 'metrics.jsonl'}")
        ev = res.get("evaluation")
        if ev:
            console.print(f"evaluated checkpoints {ev['evaluated']} (results in {out / 'eval'}, dashboard "
                          f"{out / 'dashboard' / 'index.html'})")
            for step, why in sorted(ev["skipped"].items()):
                console.print(f"[yellow]not evaluated[/]: step {step}: {why}")

    _run(body, debug)


DEFAULT_EVAL_CONFIG = REPO / "configs" / "eval" / "default.yaml"


@app.command()
def evaluate(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout."),
    data: Path = typer.Option(..., "--data", help="The prepared data it was trained on (its validation splits are evaluated)."),
    out: Path = typer.Option(None, "--out", help="Run folder for the results (default: the checkpoint's run)."),
    config: Path = typer.Option(DEFAULT_EVAL_CONFIG, "--config", help="Evaluation recipe (YAML, configs/eval/)."),
    override: List[str] = typer.Option([], "-o", "--override", help="Override a value: -o precision=bf16 (repeatable)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Evaluate a checkpoint per language: loss, perplexity, bits per byte; results in RUN_DIR/eval/."""
    from bloomline.config import load_config, to_dict
    from eval.config import EvalConfig

    def body() -> None:
        cfg = load_config(EvalConfig, config, override)
        from training.checkpoint import read_meta

        read_meta(checkpoint)  # a bad checkpoint folder is refused before any server starts
        from flows.evaluate import evaluate_flow

        res = evaluate_flow(str(checkpoint.resolve()), str(data.resolve()), to_dict(cfg), str(out.resolve()) if out else None)
        console.print(f"[bold green]done[/]: step {res['step']}, {res['tokens']:,} tokens in {res['seconds']:.1f} s; "
                      f"results in {res['results']}")
        for g in res["regressions"]:
            console.print(f"[yellow]regression[/]: {g['lang']} bits per byte {g['previous_bpb']:.4f} → {g['bpb']:.4f}")

    _run(body, debug)


@app.command()
def export(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout."),
    out: Path = typer.Option(..., "--out", help="Folder for the Hugging Face model (safetensors, config.json, tokenizer)."),
    data: Path = typer.Option(None, "--data", help="The run's prepared data, for its tokenizer (default: the checkpoint's data_dir)."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Export a checkpoint of any layout as a Hugging Face BloomForCausalLM with its tokenizer."""

    def body() -> None:
        if dtype not in ("fp32", "bf16"):
            raise BloomlineError(f"--dtype {dtype}: use fp32 or bf16")
        from eval.export import export as run_export

        path = run_export(checkpoint, out, data, dtype)
        console.print(f"[bold green]done[/]: {path} (AutoModelForCausalLM.from_pretrained and AutoTokenizer load it offline)")

    _run(body, debug)


@app.command()
def dashboard(
    run: Path = typer.Argument(..., help="A run folder (bloomline train --out) with evaluation results."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Write RUN_DIR/dashboard/index.html: one self-contained page, works offline from file://."""

    def body() -> None:
        from eval.dashboard import build

        if not run.is_dir():
            raise BloomlineError(f"{run} is not a folder")
        console.print(f"[bold green]done[/]: {build(run)}")

    _run(body, debug)


def _run(body, debug: bool) -> None:
    try:
        body()
    except BloomlineError as e:
        if debug:
            raise
        console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: rerun the same command to resume")
        raise typer.Exit(130)


def main() -> None:
    app(prog_name="bloomline")


if __name__ == "__main__":
    main()
