"""The ``bloomline`` command line.

Typer (already a dependency of Prefect) gives typed options and ``--help`` for free. Every
user-facing failure is a one-line ``error: ...`` and exit status 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import atexit
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

# Before Prefect is imported: no network here, and the temporary server must not phone home.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# The temporary server needs 10-20 s on 2 busy cores; Prefect's default of 20 s to come up fails
# runs on a loaded machine for no reason of their own.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

import typer
from rich.console import Console

from bloomline.errors import BloomlineError, ConfigError
from bloomline.terminal import printable, rich_escape
from flows.api_server import start_early, wait_ready
from flows.params import hand

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_CONFIG = REPO / "configs" / "data" / "demo.yaml"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="bloomline: multilingual corpora → trained, evaluated BLOOM-style models.",
)
# Wide enough for the summary table when output goes to a file or CI log.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


@app.callback()
def _root() -> None:
    """bloomline: multilingual corpora → trained, evaluated BLOOM-style models."""


class RichProgress:
    """Progress bars per pass of prepare (data_prep/pipeline.py PASSES): bytes and bytes/s for those
    counted in bytes, a count of their unit for the others."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        class ByUnit(ProgressColumn):
            """Bytes for passes counted in bytes, "done/total unit" for the others."""

            def __init__(self, in_bytes: ProgressColumn, other: ProgressColumn) -> None:
                super().__init__()
                self.in_bytes, self.other = in_bytes, other

            def render(self, task):  # noqa: ANN001, ANN201 (rich's signature)
                return (self.in_bytes if task.fields.get("unit") == "B" else self.other).render(task)

        self._p = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            ByUnit(DownloadColumn(), MofNCompleteColumn()),
            ByUnit(TransferSpeedColumn(), TextColumn("{task.fields[unit]}")),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, int] = {}
        self._p.start()

    def start(self, stage: str, total: int, unit: str) -> None:
        self._tasks[stage] = self._p.add_task(stage, total=max(total, 1), unit=unit)

    def advance(self, stage: str, n: int = 1) -> None:
        self._p.advance(self._tasks[stage], n)

    def finish(self, stage: str, message: str) -> None:
        tid = self._tasks.get(stage)
        if tid is not None:
            self._p.update(tid, completed=self._p.tasks[tid].total)
        self._p.console.print(f"[green]✓[/] {stage}: {rich_escape(message)}")

    def stop(self) -> None:
        self._p.stop()


@app.command()
def prepare(
    inputs: List[Path] = typer.Argument(
        None, help="JSONL / JSONL.gz / Parquet files or folders, or saved datasets; replace the config's sources."
    ),
    out: Path = typer.Option(..., "--out", help="Output folder (shards, tokenizer, manifest.json)."),
    config: Path = typer.Option(DEFAULT_DATA_CONFIG, "--config", help="Recipe (YAML)."),
    override: List[str] = typer.Option(
        [], "-o", "--override", help="Override a config value: -o dotted.key=value (repeatable)."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Stop at the first bad record instead of booking it as an error."
    ),
    dask_address: str = typer.Option(
        None,
        "--dask-address",
        help="Run on this Dask scheduler (tcp://host:8786) instead of a local cluster; sets dask.address.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Tokenize and pack multilingual corpora into length-bucketed Arrow shards."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig, SourceConfig

    def body() -> None:
        cfg = load_config(PrepareConfig, config, override)
        if inputs:
            cfg.sources = [SourceConfig(path=str(p.resolve())) for p in inputs]
        if dask_address:
            cfg.dask.address = dask_address
        check_inputs(cfg)
        start_early()
        from flows.prepare import run_prepare
        from flows.summary import print_summary

        with owned(out, "bloomline prepare"):
            progress = RichProgress()
            try:
                manifest = run_prepare(cfg, str(out), strict=strict, progress=progress)
            finally:
                progress.stop()
        if manifest.get("run_stats", {}).get("already_complete"):
            console.print(f"[green]{rich_escape(out)} is already complete[/] (same config and inputs); nothing to do.")
        print_summary(manifest, console)
        console.print(f"[bold green]done[/]: {rich_escape(Path(out) / 'manifest.json')}")

    _run(body, debug, driver=True, out=out)


def check_inputs(cfg) -> None:
    """Fail on a missing input, or one that does not fit ``memory_gib``, before any server or cluster starts."""
    if not cfg.sources:
        raise BloomlineError("no inputs: give INPUT arguments or 'sources' in the config")
    try:
        cfg.dask.validate()  # --dask-address is set after the recipe was checked
    except ConfigError as e:
        raise ConfigError(f"dask.{e.key}", e.message) from None
    from data_prep.inputs.readers import discover
    from data_prep.passes import budget

    for s in cfg.sources:
        discover(s, check=True)
    budget.check_inputs(cfg)


DEFAULT_PIPELINE_CONFIG = REPO / "configs" / "pipeline" / "demo.yaml"


@app.command()
def pipeline(
    out: Path = typer.Option(
        ..., "--out", help="Run folder of the whole job; rerun the same command to reuse or resume."
    ),
    config: Path = typer.Option(DEFAULT_PIPELINE_CONFIG, "--config", help="Pipeline recipe (YAML, configs/pipeline/)."),
    override: List[str] = typer.Option(
        [],
        "-o",
        "--override",
        help="Override a value: -o train.train.steps=60, -o data.tokenizer.vocab_size=8000 (repeatable).",
    ),
    dask_address: str = typer.Option(
        None, "--dask-address", help="Prepare the data on this Dask scheduler; sets data.dask.address."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """The main job: prepare → train (each checkpoint evaluated alongside) → dashboard → Hugging Face export."""
    from bloomline.config import load_config, to_dict
    from flows.config import PipelineConfig

    def body() -> None:
        cfg = load_config(PipelineConfig, config, override)
        if dask_address:
            cfg.data.dask.address = dask_address
        check_inputs(cfg.data)
        start_early()
        from flows.pipeline import pipeline as pipeline_flow

        with owned(out, "bloomline pipeline"):
            progress = RichProgress()
            try:
                sent, local = hand(to_dict(cfg), progress)
                wait_ready()
                res = pipeline_flow(sent, str(out.resolve()), local=local)
            finally:
                progress.stop()
        from flows.summary import print_pipeline

        print_pipeline(res, console)

    _run(body, debug, driver=True, out=out)


DEFAULT_TRAIN_CONFIG = REPO / "configs" / "train" / "bloom-tiny.yaml"


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="Folder written by 'bloomline prepare' (manifest.json, shards)."),
    out: Path = typer.Option(
        ..., "--out", help="Run folder: metrics.jsonl, tensorboard/, checkpoints/. Rerun to resume."
    ),
    config: Path = typer.Option(DEFAULT_TRAIN_CONFIG, "--config", help="Training recipe (YAML, configs/train/)."),
    override: List[str] = typer.Option([], "-o", "--override", help="Override a value: -o parallel.tp=2 (repeatable)."),
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
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Train a BLOOM model on prepared data (ranks started with the DeepSpeed launcher, on one node or several)."""
    from bloomline.config import load_config, to_dict
    from training.config import TrainRecipe

    def body() -> None:
        flags = [
            f"launch.{k}={v}"
            for k, v in (
                ("hostfile", hostfile and hostfile.resolve()),
                ("launcher", launcher),
                ("master_addr", master_addr),
                ("master_port", master_port),
                ("node_rank", node_rank),
            )
            if v is not None
        ]
        recipe = load_config(TrainRecipe, config, [*override, *flags, *(["launch.no_ssh=true"] if no_ssh else [])])
        if recipe.launch.worker_node:  # Prefect-free: the job's flow run is the first node's
            from flows.train_job import run_worker_node

            n = run_worker_node(recipe, data.resolve(), out.resolve(), say=console.print)
            console.print(f"[bold green]done[/]: node {recipe.launch.node_rank}'s ranks finished ({n} attempt(s))")
            return
        start_early()  # while the recipe is checked against the data (torch's import alone is ~1.5 s)
        from flows.train_job import validate

        validate(recipe, data)  # before any launcher or rank starts
        from flows import interrupt
        from flows.train import train as train_flow
        from flows.train_job import where_stopped

        interrupt.where(lambda: where_stopped(out, recipe.train.steps))
        with owned(out, "bloomline train"):
            sent, local = hand(to_dict(recipe))
            wait_ready()
            res = train_flow(sent, str(data.resolve()), str(out.resolve()), local=local)
        last = res.get("last", {})
        if res["stopped_by_kill_switch"]:
            console.print(
                f"[yellow]stopped by the kill switch[/] at step {res['step']}: remove {out / 'STOP'} and rerun to continue"
            )
        else:
            console.print(
                f"[bold green]done[/]: step {res['step']}/{res['steps']}, loss {last.get('loss', float('nan')):.4f} "
                f"({res['attempts']} attempt(s)); metrics in {out / 'metrics.jsonl'}"
            )
        ev = res.get("evaluation")
        if ev:
            console.print(
                f"evaluated checkpoints {ev['evaluated']} (results in {out / 'eval'}, dashboard "
                f"{out / 'dashboard' / 'index.html'})"
            )
            for step, why in sorted(ev["skipped"].items()):
                console.print(f"[yellow]not evaluated[/]: step {step}: {rich_escape(why)}")

    _run(body, debug, driver=True, out=out)


DEFAULT_EVAL_CONFIG = REPO / "configs" / "eval" / "default.yaml"


@app.command()
def evaluate(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout."
    ),
    data: Path = typer.Option(
        ..., "--data", help="The prepared data it was trained on (its validation splits are evaluated)."
    ),
    out: Path = typer.Option(None, "--out", help="Run folder for the results (default: the checkpoint's run)."),
    config: Path = typer.Option(DEFAULT_EVAL_CONFIG, "--config", help="Evaluation recipe (YAML, configs/eval/)."),
    override: List[str] = typer.Option(
        [], "-o", "--override", help="Override a value: -o precision=bf16, -o parallel.tp=2 (repeatable)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Evaluate a checkpoint per language: loss, perplexity, bits per byte; results in RUN_DIR/eval/."""
    from bloomline.config import load_config, to_dict
    from training.config import EvalConfig

    def body() -> None:
        cfg = load_config(EvalConfig, config, override)
        if cfg.heldout:  # the flow may run elsewhere: the folder as the user named it here
            cfg.heldout = str(Path(cfg.heldout).resolve())
        start_early()  # while the checkpoint is checked (its parameter names: torch, ~1.5 s)
        from eval.evaluate import checked

        # a bad checkpoint folder, other data, an unknown task, device=cuda without a GPU, a layout
        # that does not cut the model: one line here, before the flow's server and logs
        checked(checkpoint, data, cfg)
        from training.checkpoint.safe_load import check_folder

        check_folder(checkpoint)  # a file that names code, or is cut short, too (memory-mapped: fast)
        from flows.evaluate import evaluate_flow
        from training.checkpoint.run_dir import RunDir

        with owned(out or RunDir.of_checkpoint(checkpoint).root, "bloomline evaluate"):
            sent, local = hand(to_dict(cfg))
            wait_ready()
            res = evaluate_flow(
                str(checkpoint.resolve()), str(data.resolve()), sent, str(out.resolve()) if out else None, local=local
            )
        console.print(
            f"[bold green]done[/]: step {res['step']}, {res['tokens']:,} tokens in {res['seconds']:.1f} s; "
            f"results in {res['results']}"
        )
        for t in res["tasks"]:
            console.print(f"{t['task']} {t['metric']}: {t['value']:.4f} (mean of {t['n']} languages)")
        for t in res["skipped"]:
            if str(t["note"]).startswith(
                ("malformed record", "lm-eval failed")
            ):  # bad task data: an error, the rest ran
                print(printable(f"error: {t['task']} {t['lang']} not evaluated, {t['note']}"), file=sys.stderr)
            else:
                what = rich_escape(f"{t['task']} {t['lang']}: {t['note']}")
                console.print(f"[yellow]not evaluated[/]: {what}", highlight=False)
        for g in res["regressions"]:
            console.print(f"[yellow]regression[/]: {g['lang']} bits per byte {g['previous_bpb']:.4f} → {g['bpb']:.4f}")

    _run(body, debug, driver=True, out=out or checkpoint)


@app.command()
def export(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", help="A checkpoint folder (RUN_DIR/checkpoints/step_N), any layout."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Folder for the Hugging Face model (safetensors, config.json, tokenizer)."
    ),
    data: Path = typer.Option(
        None, "--data", help="The run's prepared data, for its tokenizer (default: the checkpoint's data_dir)."
    ),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 or bf16."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Export a checkpoint of any layout as a Hugging Face BloomForCausalLM with its tokenizer."""

    def body() -> None:
        if dtype not in ("fp32", "bf16"):
            raise BloomlineError(f"--dtype {dtype}: use fp32 or bf16")
        from eval.export import export as run_export

        path = run_export(checkpoint, out, data, dtype)
        console.print(
            f"[bold green]done[/]: {path} (AutoModelForCausalLM.from_pretrained and AutoTokenizer load it offline)"
        )

    _run(body, debug, driver=True, out=out)


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


@app.command()
def filters(
    data: Path = typer.Argument(..., help="A prepared data folder (bloomline prepare --out)."),
    lang: str = typer.Option(None, "--lang", help="Only this language."),
    reason: str = typer.Option(None, "--reason", help="Only this drop reason (e.g. char_repetition)."),
    examples: int = typer.Option(3, "--examples", help="Example texts per language and reason."),
    set_: List[str] = typer.Option([], "--set", help="What if: LANG.FIELD=VALUE (or defaults./code.), repeatable."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Why documents were dropped, per language and reason, with examples; how close kept documents
    sit to each threshold; and what proposed thresholds would keep or lose (from the recorded
    scores, without preparing again). Prints Markdown."""

    def body() -> None:
        from data_prep.reports.filter_report import report

        print(report(data, lang, reason, examples, set_), end="")

    _run(body, debug)


@app.command()
def plan(
    config: Path = typer.Option(
        DEFAULT_TRAIN_CONFIG,
        "--config",
        help="Training recipe (configs/train/) or pipeline recipe (configs/pipeline/).",
    ),
    gpu: str = typer.Option("a100-80gb", "--gpu", help="a100-80gb, h100-80gb, h200, or cpu (this machine)."),
    nodes: int = typer.Option(None, "--nodes", help="Plan on N nodes: DP becomes N·devices-per-node/(TP·PP)."),
    iteration_seconds: float = typer.Option(
        None, "--iteration-seconds", help="A measured iteration time: gives TFLOP/s per GPU."
    ),
    offload: bool = typer.Option(False, "--offload", help="Also plan ZeRO-Offload (optimizer states in CPU memory)."),
    override: List[str] = typer.Option([], "-o", "--override", help="Override a recipe value: -o parallel.tp=8."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Memory per pipeline stage and GPU, FLOPs, bubble and fit of a training layout, before any run."""

    def body() -> None:
        import contextlib
        import json

        from bloomline.config import load_config
        from eval.parallel.plan import eval_plan
        from flows.config import schema_for
        from training.config import TrainRecipe
        from training.planning.planner import DEVICES, cpu_device
        from training.planning.planner import plan as make_plan

        if gpu != "cpu" and gpu not in DEVICES:
            raise BloomlineError(f"--gpu {gpu}: use one of {', '.join([*DEVICES, 'cpu'])}")
        schema = schema_for(config) if config.is_file() else TrainRecipe
        recipe = load_config(schema, config, override)
        recipe = getattr(recipe, "train", recipe) if not isinstance(recipe, TrainRecipe) else recipe
        if nodes is not None and nodes < 1:
            raise BloomlineError("--nodes must be >= 1")
        # The plan uses no device; DeepSpeed's notes on choosing one go to stderr, so --json stays pure.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        with contextlib.redirect_stdout(sys.stderr):
            device = cpu_device() if gpu == "cpu" else DEVICES[gpu]
            res = make_plan(recipe, device, nodes, iteration_seconds, offload)
            settings = recipe.evaluation.settings
            res["evaluation"] = eval_plan(
                recipe.model, device, settings.batch_tokens, settings.precision or ("fp32" if gpu == "cpu" else "bf16")
            )
        if as_json:
            print(json.dumps(res, indent=1))
        else:
            from flows.summary import print_plan

            print_plan(res, console)
        if not res["fits"]:
            raise typer.Exit(1)

    _run(body, debug)


@app.command()
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
    root: List[Path] = typer.Option(
        [],
        "--root",
        help="A folder the served runs may read and write (repeatable); default: the current folder.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Start (or use) a Prefect server that requires an auth string, and serve pipeline, prepare,
    train and evaluate as deployments whose runs use only the --root folders (flows/serve.py)."""

    def body() -> None:
        import shlex

        from flows import serve_state
        from flows.serve import (
            DEPLOYMENT,
            require_auth,
            serve_deployments,
            serve_roots,
            start_server,
            stop,
            wait_healthy,
        )
        from flows.serve import api_url as url_of

        roots = serve_roots(root)
        # before Prefect is imported: this process's client and the flow runs it starts send it
        auth, source = serve_state.auth_string()
        os.environ["PREFECT_API_AUTH_STRING"] = auth
        server = None
        url = api_url
        if url is None:
            if host not in serve_state.LOOPBACK:
                from rich.markup import escape

                console.print(
                    f"[yellow]warning[/]: the Prefect server listens on {escape(host)}, reachable beyond this "
                    "machine over plain HTTP, which carries the auth string in clear: put a TLS proxy in front",
                    highlight=False,
                )
            home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect"))
            server = start_server(host, port, home / "bloomline-server.log", auth)
            url = url_of(host, port)
        try:
            wait_healthy(url, server)  # its exit (the port taken) ends serve: what answers is not it
            require_auth(url, auth, local=server is not None)
            os.environ["PREFECT_API_URL"] = url
            serve_state.write_marker(url)  # the user's other commands report here (flows/api_server.py)
            ui = url.removesuffix("/api")

            def say(text: str) -> None:  # paths and URLs as given: no rich markup read in them
                console.print(text, markup=False, highlight=False, soft_wrap=True)

            say(
                f"Prefect server {ui} (UI); deployments: "
                + ", ".join(f"{f}/{DEPLOYMENT}" for f in ("pipeline", "prepare", "train", "evaluate"))
            )
            key = f"${source}" if source in serve_state.GIVEN else f"$(cat {shlex.quote(source)})"
            say(f"auth string: {source} (the UI asks for it; clients send it as PREFECT_API_AUTH_STRING)")
            say("runs may use only: " + ", ".join(map(str, roots)))
            say(
                f'run one: PREFECT_API_URL={url} PREFECT_API_AUTH_STRING="{key}" '
                f"prefect deployment run 'pipeline/{DEPLOYMENT}' -p out={shlex.quote(str(roots[0] / 'run1'))}"
            )
            serve_deployments(roots)
        finally:
            serve_state.remove_marker()
            if server is not None:
                stop(server)

    _run(body, debug)


@contextmanager
def owned(folder: Path, command: str) -> Iterator[None]:
    """This command's job holds ``folder`` (flows/runlock.py): a second job on it is refused with
    one line naming the holder; a lock left by a dead job is taken over, with a warning."""
    from flows.runlock import acquire

    with acquire(folder, command, say=lambda msg: console.print(f"[yellow]{rich_escape(msg)}[/]", highlight=False)):
        yield


def _run(body, debug: bool, driver: bool = False, out: Path | None = None) -> None:
    """Run a command's ``body``: a BloomlineError ends it in one line with exit status 2, and so does
    a full disk (bloomline/disk.py) where it writes into ``out``; a driver's Ctrl-C ends its job
    (flows/interrupt.py)."""
    from bloomline.secrets import install_log_masking

    install_log_masking()
    if driver:  # every process this command starts ends with it (flows/lifeline.py), Ctrl-C too
        from flows import interrupt
        from flows.lifeline import become_driver

        become_driver()
        interrupt.install()
    if not debug:
        from flows import user_errors

        user_errors.install()
    try:
        try:
            body()
        except Exception as e:
            from bloomline.disk import disk_full_error, full_disk

            if out is not None and not isinstance(e, BloomlineError) and full_disk(e, out):
                raise disk_full_error(e, out) from None
            raise
    except BloomlineError as e:
        if debug:
            raise
        from bloomline.secrets import mask_text

        console.print(f"[bold red]error:[/] {rich_escape(mask_text(str(e)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: rerun the same command to resume")
        raise typer.Exit(130) from None


def main() -> None:
    atexit.register(_exit_now)  # registered first, so run last: after every other exit handler
    try:
        app(prog_name="bloomline")
        _exit_code[0] = 0
    except SystemExit as e:
        _exit_code[0] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise


_exit_code = [1]  # what the process exits with: 1 unless main() returned or exited with a code


def _exit_now() -> None:
    """The end of the process, without the interpreter's teardown of every module a command has
    loaded (Prefect, Dask, pyarrow, torch): ~0.9 s at the end of each command, measured on
    ``prepare``, that a finished command has no use for. By the time this runs, Python has
    joined the non-daemon threads (Prefect drains its log and event queues there) and run every
    other exit handler (the temporary Prefect server stopped, logging flushed); the standard
    streams are flushed here. Files are closed where they are written (bloomline/io.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_code[0])


if __name__ == "__main__":
    main()
