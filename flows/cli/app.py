"""The ``bloomline`` command line: the commands of flows/cli/ in one Typer app (typed options
and ``--help`` for free; Typer is already a dependency of Prefect). Every user-facing failure is a
one-line ``error: ...`` and exit status 2; ``--debug`` shows the traceback instead
(flows/cli/base.py)."""

from __future__ import annotations

import os

# Before Prefect is imported: no network here, and the temporary server must not phone home.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# The temporary server needs 10-20 s on 2 busy cores; Prefect's default of 20 s to come up fails
# runs on a loaded machine for no reason of their own.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

import typer

from flows.cli import jobs, tools
from flows.cli.base import run_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="bloomline: multilingual corpora → trained, evaluated BLOOM-style models.",
)
for command in (jobs.prepare, jobs.pipeline, jobs.train, jobs.evaluate):
    app.command()(command)
for command in (tools.export, tools.dashboard, tools.filters, tools.plan, tools.serve):
    app.command()(command)


@app.callback()
def _root() -> None:
    """bloomline: multilingual corpora → trained, evaluated BLOOM-style models."""


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
