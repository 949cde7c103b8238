"""``bloomline serve``: a Prefect server (started here, or one that exists) with bloomline's flows
registered as deployments, so a team runs ``pipeline``, ``prepare``, ``train`` and ``evaluate``
from the Prefect UI or ``prefect deployment run``.

Prefect's own ``serve`` does the work: it registers the deployments and, in this process, polls
the server for runs of them and executes each one in a subprocess. Each deployment's default
parameters are the bundled recipes as JSON, so the UI shows every value, editable.

Security: a server started here listens on 127.0.0.1 unless ``--host`` says otherwise, and
Prefect's server has no authentication of its own (set ``PREFECT_SERVER_API_AUTH_STRING`` to
require one); logs go through bloomline's masking (bloomline/secrets.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bloomline.errors import BloomlineError
from training.loop.launch import kill_group

REPO = Path(__file__).resolve().parents[1]
DEPLOYMENT = "bloomline"  # each flow's deployment name: run it as "<flow>/bloomline"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def api_url(host: str, port: int) -> str:
    """The API address of a server listening on ``host``: a wildcard is reached through loopback,
    and an IPv6 address goes in brackets (RFC 3986)."""
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{reach}]' if ':' in reach else reach}:{port}/api"


def wait_healthy(api_url: str, timeout: float = 180.0) -> None:
    """Until ``GET {api_url}/health`` answers (the temporary SQLite database is migrated first)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.5)
    raise BloomlineError(f"the Prefect server at {api_url} did not answer within {timeout:.0f} s ({last})")


def start_server(host: str, port: int, log_file: Path) -> subprocess.Popen:
    """``prefect server start`` in its own session (stopped with its process group)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
    }
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        kill_group(proc)


def default_parameters() -> dict[str, dict[str, Any]]:
    """Each flow's parameters with the bundled recipes filled in (``out`` and paths are the user's)."""
    from bloomline.config import load_config, to_dict
    from data_prep.config import PrepareConfig
    from flows.config import PipelineConfig
    from training.config import EvalConfig, TrainRecipe

    configs = REPO / "configs"
    return {
        "pipeline": {"config": to_dict(load_config(PipelineConfig, configs / "pipeline" / "demo.yaml"))},
        "prepare": {"config": to_dict(load_config(PrepareConfig, configs / "data" / "demo.yaml"))},
        "train": {"recipe": to_dict(load_config(TrainRecipe, configs / "train" / "bloom-tiny.yaml"))},
        "evaluate": {"config": to_dict(load_config(EvalConfig, configs / "eval" / "default.yaml"))},
    }


def deployments() -> list[Any]:
    from flows.evaluate import evaluate_flow
    from flows.pipeline import pipeline
    from flows.prepare import prepare
    from flows.train import train

    params = default_parameters()
    flows = {"pipeline": pipeline, "prepare": prepare, "train": train, "evaluate": evaluate_flow}
    return [
        f.to_deployment(
            name=DEPLOYMENT,
            parameters=params[name],
            tags=["bloomline"],
            description=(f.__doc__ or "").strip().splitlines()[0],
        )
        for name, f in flows.items()
    ]


def serve_deployments() -> None:
    """Register the deployments on the server at PREFECT_API_URL and run what it schedules (blocks)."""
    from prefect import serve

    from bloomline.secrets import install_log_masking
    from flows import user_errors

    install_log_masking()
    user_errors.install()
    os.chdir(REPO)  # the flow runs' subprocesses import the flows from here
    serve(*deployments(), print_starting_message=True)
