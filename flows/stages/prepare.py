"""The Prefect flow ``prepare``: each pass of data_prep/pipeline.py ``PASSES`` is one (coarse)
Prefect task, and the fine-grained parallel work inside a pass runs on Dask.

Why not Prefect's DaskTaskRunner: a Prefect task costs about a second here, so per-chunk tasks
would be overhead, and every DaskTaskRunner worker starts its own temporary Prefect server when
no server is configured. Passes as tasks give the Prefect UI its timeline; Dask does the rest.

Resume does not rely on Prefect's result cache: the pass markers under ``DIR/.work`` make a
rerun skip finished work with or without a Prefect server (see data_prep/pipeline.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from bloomline.config import Location, recipe_of, to_dict
from bloomline.mirror import drop
from bloomline.secrets import mask_text, mask_tree, masks_exceptions
from bloomline.storage import absolute, is_url
from data_prep.config import PrepareConfig
from data_prep.pipeline import Progress, run_all
from flows.display.summary import summary_rows
from flows.run.api_server import wait_ready
from flows.run.dask_cluster import dask_client, dask_map, warm_worker
from flows.run.params import InProcess, flow_args, typed
from flows.run.runlock import owns


def _as_task(name: str, fn: Callable[[], Any]) -> Any:
    """One pass of data_prep/pipeline.py ``PASSES`` as a Prefect task of its name."""
    return task(masks_exceptions(fn), name=name, cache_policy=NONE, persist_result=False)()


@flow(name="prepare", log_prints=False, persist_result=False)
@masks_exceptions
@owns(lambda config, out, local: out, "flow prepare")
def prepare(config: recipe_of(PrepareConfig), out: Location, local: InProcess | None = None) -> dict[str, Any]:
    """Raw corpora → length-bucketed Arrow shards + manifest.json in ``out`` (``local``:
    flows/run/params.py, the real config and a progress display from a caller in this process)."""
    cfg = typed(PrepareConfig, config, local)
    progress = local.progress if local is not None and local.progress is not None else Progress()
    log = get_run_logger()
    log.info("preparing %d source(s) into %s", len(cfg.sources), out)
    given = local.dask if local is not None else None
    with nullcontext(given) if given is not None else dask_client(cfg) as client:
        try:
            manifest = run_all(cfg, out, map_fn=dask_map(client), as_task=_as_task, progress=progress)
        finally:
            if is_url(out):  # the workers' copies of a folder at a URL: the store holds it all
                client.run(drop, out)
    rows = summary_rows(manifest)
    create_table_artifact(
        key="prepare-summary",
        table=mask_tree(rows),
        description=mask_text(f"Per-language summary of `bloomline prepare` → {absolute(out)}"),
    )
    from data_prep.reports.filter_report import report

    create_markdown_artifact(
        mask_text(report(out, examples=3)),
        key="filter-report",
        description=mask_text(f"Drops by language and reason, and kept documents near a threshold → {absolute(out)}"),
    )
    return manifest


def run_prepare(cfg: PrepareConfig, out: str, progress: Progress | None = None) -> dict[str, Any]:
    """The flow, from a caller in this process: its Dask cluster starts, and its workers load what
    the chunks pass needs, while Prefect's server starts (flows/run/api_server.py ``start_early``)."""
    with dask_client(cfg) as client:
        workers = list(client.scheduler_info()["workers"])
        warming = [client.submit(warm_worker, cfg.langid.enabled, workers=[w], pure=False) for w in workers]
        wait_ready()
        config, local = flow_args(to_dict(cfg), progress, dask=client, checked=cfg)
        manifest = prepare(config, str(out), local=local)
        del warming  # held until here: a released future's task may be cancelled before it ran
        return manifest
