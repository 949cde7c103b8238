"""The Prefect flow ``prepare``: each pipeline stage is one (coarse) Prefect task, and the
fine-grained parallel work inside a stage runs on Dask.

Why not Prefect's DaskTaskRunner: a Prefect task costs about a second here, so per-chunk tasks
would be overhead, and every DaskTaskRunner worker starts its own temporary Prefect server when
no server is configured. Stages as tasks give the Prefect UI its timeline; Dask does the rest.

Resume does not rely on Prefect's result cache: the stage markers under ``DIR/.work`` make a
rerun skip finished work with or without a Prefect server (see data_prep/pipeline.py).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import dask
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from bloomline.config import from_dict, to_dict
from bloomline.secrets import install_log_masking, mask_text, mask_tree
from data_prep.config import PrepareConfig
from data_prep.pipeline import Progress, run_all
from flows.api_server import wait_ready
from flows.params import Local, hand, real
from flows.runlock import owns
from flows.summary import summary_rows

# Dask's INFO chatter (workers starting, connections) would drown the stage progress.
for _name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core", "distributed.worker"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def _mask_worker_logs(worker: Any = None) -> None:
    install_log_masking()


@contextmanager
def environ_kept() -> Iterator[None]:
    """os.environ as it was before, afterwards. A LocalCluster's nannies run in this process and
    set ``distributed.nanny.pre-spawn-environ`` (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1,
    OPENBLAS_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED) in *this* process's
    environment before each worker starts, and leave them there: every process the driver
    starts afterwards inherited them, so the training ranks of a pipeline that had just prepared
    its data ran torch on one thread, and a rerun that reused the data on all of them, and their
    gradients differed in the last bits (issue 21)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for k in [k for k in os.environ if k not in before]:
            del os.environ[k]
        os.environ.update(before)


QUIET_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
}
"""What a local cluster's workers do beside their tasks, quieted: the statistical profiler (a
thread taking the GIL every 10 ms to sample stacks) feeds a dashboard the local cluster does not
start, and the event-loop tick (20 ms), memory and system monitors wake the worker's loop thread,
which takes the GIL from the task each time. Measured on the 4x corpus's first 8 chunks, 2
workers: the steps' seconds 12.4 on average with Dask's defaults, 9.9 quieted, 11.0 in a plain
process pool (runs vary by ±15% on this machine)."""


@contextmanager
def dask_client(cfg: PrepareConfig) -> Iterator[Any]:
    """A Dask client: the scheduler at ``dask.address``, else a LocalCluster of processes; on
    every worker, log records are masked (bloomline/secrets.py) before Dask sees them. The
    driver's environment is the same after it as before (:func:`environ_kept`)."""
    from distributed import Client, LocalCluster

    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            client.register_worker_callbacks(_mask_worker_logs)  # also on workers that join later
            yield client
        return
    # One single-threaded process per core: SentencePiece, fastText and the filters are
    # CPU-bound Python/C++ that holds the GIL for long stretches.
    with (
        environ_kept(),
        dask.config.set(QUIET_WORKERS),
        LocalCluster(
            n_workers=cfg.dask.workers(),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=cfg.dask.memory_limit,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_worker_callbacks(_mask_worker_logs)
        yield client


def dask_map(client: Any) -> Callable:
    from distributed import as_completed

    def map_fn(func: Callable, items: list) -> Iterator[Any]:
        if not items:
            return
        futures = client.map(func, items, pure=False)
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.cancel(futures)

    return map_fn


def _stage(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    return task(fn, name=name, cache_policy=NONE, persist_result=False)(*args)


@flow(name="prepare", log_prints=False, persist_result=False)
@owns(lambda config, out, strict, local: out, "flow prepare")
def prepare(config: dict[str, Any], out: str, strict: bool = False, local: Local | None = None) -> dict[str, Any]:
    """Raw corpora → length-bucketed Arrow shards + manifest.json in ``out`` (``local``:
    flows/params.py, the real config and a progress display from a caller in this process)."""
    cfg = from_dict(PrepareConfig, real(config, local))
    progress = local.progress if local is not None and local.progress is not None else Progress()
    log = get_run_logger()
    log.info("preparing %d source(s) into %s", len(cfg.sources), out)
    given = local.dask if local is not None else None
    with nullcontext(given) if given is not None else dask_client(cfg) as client:
        manifest = run_all(cfg, out, strict=strict, map_fn=dask_map(client), stage=_stage, progress=progress)
    rows = summary_rows(manifest)
    create_table_artifact(
        key="prepare-summary",
        table=mask_tree(rows),
        description=mask_text(f"Per-language summary of `bloomline prepare` → {Path(out).resolve()}"),
    )
    from data_prep.filter_report import report

    create_markdown_artifact(
        mask_text(report(out, examples=3)),
        key="filter-report",
        description=mask_text(
            f"Drops by language and reason, and kept documents near a threshold → {Path(out).resolve()}"
        ),
    )
    return manifest


def run_prepare(cfg: PrepareConfig, out: str, strict: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """The flow, from a caller in this process: its Dask cluster starts, and its workers load what
    the chunk stage needs, while Prefect's server starts (flows/api_server.py ``start_early``)."""
    with dask_client(cfg) as client:
        workers = list(client.scheduler_info()["workers"])
        warming = [client.submit(warm_worker, cfg.langid.enabled, workers=[w], pure=False) for w in workers]
        wait_ready()
        config, local = hand(to_dict(cfg), progress, dask=client)
        manifest = prepare(config, str(out), strict, local=local)
        del warming  # held until here: a released future's task may be cancelled before it ran
        return manifest


def warm_worker(langid: bool) -> None:
    """What every chunk task of a worker process needs first: the stages' modules, the character
    tables, the language-ID model (each loaded once per process)."""
    import data_prep.chunks  # noqa: F401
    import data_prep.pack_parts  # noqa: F401
    from data_prep.text import punct_or_symbol_chars, special_chars, unkept_table

    special_chars(), punct_or_symbol_chars(), unkept_table()
    if langid:
        from data_prep.langid import load_model

        load_model()
