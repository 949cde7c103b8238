"""The commands that run a job on a folder, each as one Prefect flow: ``prepare``, ``pipeline``,
``train`` and ``evaluate``. Each checks what it can in one line before Prefect's server (started
early, flows/run/api_server.py) is waited for, then runs its flow (base.py ``run_flow``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List

import typer

from bloomline.errors import BloomlineError
from bloomline.storage import absolute, is_url, join
from bloomline.terminal import rich_escape
from flows.cli.base import Debug, console, local_out, no_credentials, overrides, owned, run_command, run_flow
from flows.config import DEFAULT_RECIPES, HELDOUT_RECIPE
from flows.run.api_server import start_early
from flows.run.served import SAMPLE_CORPUS

if TYPE_CHECKING:
    from data_prep.config import PrepareConfig


def prepare(
    inputs: List[str] = typer.Argument(
        None,
        help="JSONL / JSONL.gz / Parquet files or folders, or saved datasets, local or at a URL "
        "(s3://, gs://, hf://, https://); replace the config's sources.",
    ),
    out: str = typer.Option(
        ..., "--out", help="Output folder (shards, tokenizer, manifest.json), local or at a URL (s3://bucket/run)."
    ),
    config: Path = typer.Option(
        None,
        "--config",
        help="Recipe (YAML): configs/data/bloom.yaml for real work; without it, the bundled sample's "
        "configs/data/demo.yaml, which takes no other corpus.",
    ),
    override: List[str] = overrides("dedup.near=false"),
    strict: bool = typer.Option(
        False, "--strict", help="Stop at the first bad record instead of booking it as an error."
    ),
    dask_address: str = typer.Option(
        None,
        "--dask-address",
        help="Run on this Dask scheduler (tcp://host:8786) instead of a local cluster; sets dask.address.",
    ),
    debug: Debug = False,
) -> None:
    """Tokenize and pack multilingual corpora into length-bucketed Arrow shards."""

    def body() -> None:
        from bloomline.config import load_config
        from data_prep.config import PrepareConfig, SourceConfig
        from data_prep.pipeline import preflight

        no_credentials(out=out, inputs=inputs)
        recipe = config or _sample_recipe(inputs)
        cfg = load_config(PrepareConfig, recipe, override)
        cfg.recipe = str(recipe)
        if inputs:
            cfg.sources = [SourceConfig(path=p if is_url(p) else str(Path(p).resolve())) for p in inputs]
        if dask_address:
            cfg.dask.address = dask_address
        cfg.strict = cfg.strict or strict
        preflight(cfg)
        console.print(f"[bold]recipe[/] {rich_escape(cfg.summary())}", highlight=False)
        start_early()
        from flows.display.summary import print_summary
        from flows.stages.prepare import run_prepare

        with owned(out, "bloomline prepare", bars=True) as bars:
            manifest = run_prepare(cfg, str(out), progress=bars)
        if manifest.get("run_stats", {}).get("already_complete"):
            console.print(f"[green]{rich_escape(out)} is already complete[/] (same config and inputs); nothing to do.")
        print_summary(manifest, console)
        console.print(f"[bold green]done[/]: {rich_escape(join(out, 'manifest.json'))}")

    run_command(body, debug, driver=True, out=out)


def _sample_recipe(inputs: list[str] | None) -> Path:
    """The recipe of a ``prepare`` given no ``--config``: the demo's, for the bundled sample only. Its
    sizes (a 4,000-token vocabulary, samples of at most 512 tokens) would shape a real corpus
    without a word; BLOOM's (a 250,680-token vocabulary) would make the sample a week's work. The
    user chooses, once, in one line."""
    for p in inputs or []:
        if is_url(p) or not Path(p).resolve().is_relative_to(SAMPLE_CORPUS):
            raise BloomlineError(
                f"{p} is not the bundled sample: choose a recipe, --config configs/data/bloom.yaml (BLOOM's "
                f"sizes: real work) or --config configs/data/demo.yaml (the sample's small sizes: a quick try)"
            )
    return DEFAULT_RECIPES["data"]


def pipeline(
    out: Path = typer.Option(
        ..., "--out", help="Run folder of the whole job; rerun the same command to reuse or resume."
    ),
    config: Path = typer.Option(
        DEFAULT_RECIPES["pipeline"], "--config", help="Pipeline recipe (YAML, configs/pipeline/)."
    ),
    override: List[str] = overrides("train.train.steps=60, -o data.tokenizer.vocab_size=8000"),
    dask_address: str = typer.Option(
        None, "--dask-address", help="Prepare the data on this Dask scheduler; sets data.dask.address."
    ),
    debug: Debug = False,
) -> None:
    """The main job: prepare → train (each checkpoint evaluated alongside) → dashboard → Hugging Face export."""

    def body() -> None:
        from bloomline.config import load_config, to_dict
        from data_prep.pipeline import preflight
        from flows.config import PipelineConfig

        local_out(out, "the main job's run folder is local (docs/object-storage.md)")

        cfg = load_config(PipelineConfig, config, override)
        if dask_address:
            cfg.data.dask.address = dask_address
        preflight(cfg.data)
        start_early()
        from flows.display.summary import print_pipeline
        from flows.stages.pipeline import pipeline as pipeline_flow

        run_out = str(out.resolve())
        res = run_flow(
            "bloomline pipeline", out, to_dict(cfg), lambda p, i: pipeline_flow(p, run_out, local=i), True, checked=cfg
        )
        print_pipeline(res, console)

    run_command(body, debug, driver=True, out=out)


def train(
    data: str = typer.Option(..., "--data", help="Folder written by 'bloomline prepare', or its URL (s3://…)."),
    out: Path = typer.Option(
        ..., "--out", help="Run folder: metrics.jsonl, tensorboard/, checkpoints/. Rerun to resume."
    ),
    config: Path = typer.Option(DEFAULT_RECIPES["train"], "--config", help="Training recipe (YAML, configs/train/)."),
    override: List[str] = overrides("parallel.tp=2"),
    hostfile: Path = typer.Option(
        None,
        "--hostfile",
        help="Train on the nodes of this DeepSpeed hostfile ('host slots=N' lines); sets launch.hostfile.",
    ),
    launcher: str = typer.Option(
        None,
        "--launcher",
        help="How DeepSpeed reaches the nodes: pdsh (default), openmpi, slurm, mpich, impi, mvapich.",
    ),
    master_addr: str = typer.Option(None, "--master-addr", help="Address of the first node (rank 0's rendezvous)."),
    master_port: int = typer.Option(None, "--master-port", help="Rendezvous port (the same on every node)."),
    no_ssh: bool = typer.Option(
        False, "--no-ssh", help="Start only this node's ranks; run the same command on every node with its --node-rank."
    ),
    node_rank: int = typer.Option(None, "--node-rank", help="This node's index in the hostfile (with --no-ssh)."),
    debug: Debug = False,
) -> None:
    """Train a BLOOM model on prepared data (ranks started with the DeepSpeed launcher, on one node or several)."""
    launch = {"hostfile": hostfile and hostfile.resolve(), "launcher": launcher, "master_addr": master_addr}
    launch.update(master_port=master_port, node_rank=node_rank, no_ssh=no_ssh or None)

    def body() -> None:
        from bloomline.config import load_config, to_dict
        from training.config import TrainRecipe

        no_credentials(data=data)
        local_out(out, "keep its checkpoints in a bucket with -o checkpoint.mirror=URL (docs/object-storage.md)")
        flags = [f"launch.{k}={'true' if v is True else v}" for k, v in launch.items() if v is not None]
        recipe = load_config(TrainRecipe, config, [*override, *flags])
        if recipe.launch.worker_node:  # Prefect-free: the job's flow run is the first node's
            from flows.stages.train_job import run_worker_node

            n = run_worker_node(recipe, absolute(data), out.resolve(), say=console.print)
            console.print(f"[bold green]done[/]: node {recipe.launch.node_rank}'s ranks finished ({n} attempt(s))")
            return
        start_early()  # while the recipe is checked against the data (torch's import alone is ~1.5 s)
        from flows.stages.train_job import check, where_stopped

        checked = check(recipe, data)  # before any launcher or rank starts; the flow runs on it
        from flows.display.summary import print_trained
        from flows.run import interrupt
        from flows.stages.train import train as train_flow

        interrupt.where(lambda: where_stopped(out, recipe.train.steps))
        at = absolute(data), str(out.resolve())
        res = run_flow(
            "bloomline train", out, to_dict(recipe), lambda p, i: train_flow(p, *at, local=i), checked=checked
        )
        print_trained(res, out, console)

    run_command(body, debug, driver=True, out=out)


def evaluate(
    checkpoint: str = typer.Option(
        None,
        "--checkpoint",
        help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout, or its URL (a checkpoint.mirror's: "
        "then give --out).",
    ),
    model: Path = typer.Option(
        None,
        "--model",
        help="Instead of --checkpoint: a Hugging Face BLOOM folder (config.json, safetensors, tokenizer.json), "
        "evaluated as published; give --text (or --data) and --out.",
    ),
    text: List[str] = typer.Option(
        None,
        "--text",
        help="Text to evaluate on (JSONL / Parquet files or folders, local or at a URL; repeat the option), "
        "prepared with the model's tokenizer into OUT/data; with --checkpoint, instead of its validation split.",
    ),
    text_config: Path = typer.Option(
        HELDOUT_RECIPE, "--text-config", help="How --text is prepared (a data recipe, configs/data/)."
    ),
    data: str = typer.Option(
        None,
        "--data",
        help="The prepared data the checkpoint was trained on (its validation splits are evaluated), local or at a "
        "URL; with --model, data prepared with the model's tokenizer.",
    ),
    out: Path = typer.Option(None, "--out", help="Run folder for the results (default: the checkpoint's run)."),
    config: Path = typer.Option(DEFAULT_RECIPES["eval"], "--config", help="Evaluation recipe (YAML, configs/eval/)."),
    override: List[str] = overrides("precision=bf16, -o parallel.tp=2"),
    debug: Debug = False,
) -> None:
    """Evaluate a checkpoint or a published model per language: loss, perplexity, bits per byte and
    every task; results, dashboard and report in RUN_DIR/eval/."""

    def body() -> None:
        from bloomline.config import load_config, to_dict
        from training.config import EvalConfig

        no_credentials(checkpoint=checkpoint, data=data, text=text)
        local_out(out, "the results go into a local run folder")
        what = _evaluated(checkpoint, model, text, data, out)
        cfg = load_config(EvalConfig, config, override)
        start_early()  # while the checkpoint is checked (its parameter names: torch, ~1.5 s)
        from data_prep.storage.data_cache import prepared
        from eval.evaluate import check_published, checked
        from flows.display.summary import print_evaluated
        from flows.stages.evaluate import evaluate_flow
        from training.checkpoint.mirror import checkpoint_at
        from training.checkpoint.run_dir import RunDir
        from training.checkpoint.safe_load import check_folder

        if model is not None:
            check_published(model, cfg)  # not a BLOOM, no tokenizer, a layout that does not cut it
            local = model
        else:
            local = checkpoint_at(what)  # a URL: a copy on this machine
        where = absolute(data) if data else str((out / "data").resolve())
        if text:  # prepared with the model's tokenizer: the published folder's, or the checkpoint's data's
            from data_prep.storage.shards import load_manifest, tokenizer_file
            from flows.stages.prepare import run_prepare

            at_text = str((out / "data").resolve())
            trained_on = prepared(where)  # (a URL: this node's copy, fetched once)
            own = model if model is not None else tokenizer_file(trained_on, load_manifest(trained_on))
            prep = _text_recipe(text_config, text, own)
            with owned(Path(at_text), "bloomline evaluate --text", bars=True) as bars:
                run_prepare(prep, at_text, progress=bars)
            if model is None:  # the checkpoint keeps its data (what it trained on) and is evaluated on this
                cfg.heldout = at_text
        # a bad checkpoint folder, other data, an unknown task, device=cuda without a GPU, a layout
        # that does not cut the model: one line here, before the flow's server and logs
        meta = checked(local, prepared(where), cfg)  # the flow evaluates with it: bloomline.json read once
        check_folder(local)  # a file that names code, or is cut short, too (memory-mapped: fast)
        at = str(local.resolve()), where
        to = str(out.resolve()) if out else None
        folder = out or RunDir.of_checkpoint(local).root
        res = run_flow(
            "bloomline evaluate", folder, to_dict(cfg), lambda p, i: evaluate_flow(*at, p, to, local=i), checked=meta
        )
        print_evaluated(res, console)

    run_command(
        body,
        debug,
        driver=True,
        out=out or (None if checkpoint is None or is_url(checkpoint) else Path(checkpoint)),
    )


def _evaluated(
    checkpoint: str | None, model: Path | None, text: list[str] | None, data: str | None, out: Path | None
) -> str:
    """What ``evaluate`` was given, checked in one line: the checkpoint (or model folder)."""
    if (checkpoint is None) == (model is None):
        raise BloomlineError("give --checkpoint (a bloomline checkpoint) or --model (a Hugging Face BLOOM folder)")
    if checkpoint is not None:
        if text and out is None:
            raise BloomlineError("--text needs --out, the folder for the results on that text (and for the text)")
        if data is None:
            raise BloomlineError("--checkpoint needs --data, the prepared data it was trained on")
        if is_url(checkpoint) and out is None:
            raise BloomlineError(f"--checkpoint {checkpoint} is a URL: give --out, the run folder for its results")
        return checkpoint
    if bool(text) == (data is not None):
        raise BloomlineError("--model needs --text (the text to evaluate on) or --data (prepared with its tokenizer)")
    if out is None:
        raise BloomlineError("--model needs --out, the folder for the results (and for the prepared --text)")
    return str(model)


def _text_recipe(recipe: Path, text: list[str], tokenizer: Path) -> "PrepareConfig":
    """The data recipe ``--text`` is prepared with: its sources the given paths, its tokenizer the
    model's (a model folder, or a tokenizer file)."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import preflight

    cfg = load_config(PrepareConfig, recipe, [])
    cfg.sources = [SourceConfig(path=p if is_url(p) else str(Path(p).resolve())) for p in text]
    cfg.tokenizer.model = str(Path(tokenizer).resolve())
    preflight(cfg)
    return cfg
