"""``bloomline serve``: a Prefect server (started here, or one that exists) with bloomline's flows
registered as deployments, so a team runs ``pipeline``, ``prepare``, ``train`` and ``evaluate``
from the Prefect UI or ``prefect deployment run``.

Prefect's own ``serve`` does the work: it registers the deployments and, in this process, polls
the server for runs of them and executes each one in a subprocess. Each deployment's default
parameters are the bundled recipes as JSON, so the UI shows every value, editable.

Security. Whoever can create a run of a deployment runs code as the serving user (an
``evaluate`` of a planted checkpoint, a ``prepare`` on their own Dask scheduler), so:

- the server requires an auth string (Prefect's ``PREFECT_SERVER_API_AUTH_STRING``; every
  request but ``/health`` without it gets 401). The one the user gives
  (``PREFECT_SERVER_API_AUTH_STRING`` or ``PREFECT_API_AUTH_STRING``), else the one kept in
  ``~/.bloomline/serve/auth`` (mode 0600; ``$BLOOMLINE_HOME/serve/auth``), made by the first serve
  (flows/run/serve_state.py). This process's client and the flow runs it starts send it
  (``PREFECT_API_AUTH_STRING``); the user's ``prefect`` CLI reads it from that file, the UI asks
  for it, the user's other ``bloomline`` commands find it themselves (flows/run/api_server.py). An
  existing server (``--api-url``) that answers without it is refused;
- nothing is sent the auth string on this host's port unless every socket listening there is
  this user's (another user's process holding the port would get it, and then the runs), and
  the server serve starts must be alive when it answers: a port something already listens on is
  refused before the start, and the start's exit (its port taken meanwhile) ends serve;
- the server listens on 127.0.0.1 unless ``--host`` says otherwise (with a warning then: the
  auth string crosses the network in clear HTTP; put a TLS proxy in front);
- a run may use only the folders given as ``--root`` (the current folder by default), may not
  name a Dask scheduler, launcher arguments or an NCCL file, library or plugin
  (flows/run/served.py, checked before the run touches anything);
- logs go through bloomline's masking (bloomline/secrets.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from bloomline.errors import BloomlineError
from flows.run.serve_state import LOOPBACK, listener_uids, listeners_ours, status
from flows.run.served import REPO
from training.loop.launch import kill_group

DEPLOYMENT = "bloomline"  # each flow's deployment name: run it as "<flow>/bloomline"


def api_url(host: str, port: int) -> str:
    """The API address of a server listening on ``host``: a wildcard is reached through loopback,
    and an IPv6 address goes in brackets (RFC 3986)."""
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{reach}]' if ':' in reach else reach}:{port}/api"


def wait_healthy(api_url: str, proc: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    """Until ``GET {api_url}/health`` answers (the temporary SQLite database is migrated first).
    ``proc``, the server started to answer there: a BloomlineError as soon as it has exited (its
    port was taken: what answers there is not it)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BloomlineError(
                f"the Prefect server exited (code {proc.returncode}) before it answered at {api_url}: "
                "is its port taken? (choose another --port)"
            )
        try:
            with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.5)
    raise BloomlineError(f"the Prefect server at {api_url} did not answer within {timeout:.0f} s ({last})")


def start_server(host: str, port: int, log_file: Path, auth: str) -> subprocess.Popen:
    """``prefect server start`` in its own session (stopped with its process group), requiring
    ``auth`` of every request but its health check. A BloomlineError, before anything starts,
    when something already listens on ``port`` (it would answer in the server's place)."""
    if listener_uids(port):
        raise BloomlineError(f"port {port} is already in use on this host: choose another --port")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_API_AUTH_STRING": auth,
    }
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def require_auth(api_url: str, auth: str, local: bool = False) -> None:
    """Refuse a server that answers without ``auth`` (anyone who reaches it could run code
    here), or that refuses it; the string itself is never shown. On this host (``local``, or a
    loopback address), first refuse, before anything is sent, a port where a socket of another
    user's listens, or where none can be seen (:func:`flows.run.serve_state.listeners_ours`)."""
    u = urllib.parse.urlsplit(api_url)
    if local or u.hostname in LOOPBACK:
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError as e:  # a port out of range
            raise BloomlineError(f"{api_url}: {e}") from None
        if not listeners_ours(port):
            raise BloomlineError(
                f"port {port} on this host is not provably this user's (another user's process may listen "
                "there): the auth string is not sent to it"
            )
    code = status(api_url, None)
    if code is None:
        raise BloomlineError(f"the Prefect server at {api_url} stopped answering")
    if code != 401:
        raise BloomlineError(
            f"the Prefect server at {api_url} answers requests without authentication: "
            "start it with PREFECT_SERVER_API_AUTH_STRING set (bloomline serve starts its own so)"
        )
    if status(api_url, auth) != 200:
        raise BloomlineError(
            f"the Prefect server at {api_url} refuses this auth string: set PREFECT_API_AUTH_STRING to its own"
        )


def serve_roots(paths: list[str | Path]) -> list[str]:
    """The folders served runs may use (``--root``; the current folder when none), resolved, and
    the URL prefixes, as given; a BloomlineError for a folder that is not one, or a URL with
    credentials or a '.' or '..' part."""
    from bloomline.storage import check_no_credentials, is_url

    roots = []
    for given in paths or [Path.cwd()]:
        if is_url(str(given)):
            check_no_credentials(str(given), "--root")
            if any(p in (".", "..") for p in str(given).split("://", 1)[1].split("/")):
                raise BloomlineError(f"--root {given}: a URL prefix without '.' or '..' parts")
            roots.append(str(given).rstrip("/"))
            continue
        root = Path(os.path.realpath(given))
        if not root.is_dir():
            raise BloomlineError(f"--root {given}: not a folder")
        roots.append(str(root))
    return roots


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
    from flows.config import DEFAULT_RECIPES as R
    from flows.config import PipelineConfig
    from training.config import EvalConfig, TrainRecipe

    return {
        "pipeline": {"config": to_dict(load_config(PipelineConfig, R["pipeline"]))},
        "prepare": {"config": to_dict(load_config(PrepareConfig, R["data"]))},
        "train": {"recipe": to_dict(load_config(TrainRecipe, R["train"]))},
        "evaluate": {"config": to_dict(load_config(EvalConfig, R["eval"]))},
    }


def deployments() -> list[Any]:
    from flows.stages.evaluate import evaluate_flow
    from flows.stages.pipeline import pipeline
    from flows.stages.prepare import prepare
    from flows.stages.train import train

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


def serve_deployments(roots: list[str]) -> None:
    """Register the deployments on the server at PREFECT_API_URL and run what it schedules
    (blocks); the flow runs may use only ``roots`` (flows/run/served.py)."""
    from prefect import serve

    from bloomline.secrets import install_log_masking
    from flows.run import user_errors
    from flows.run.served import ROOTS_ENV

    install_log_masking()
    user_errors.install()
    os.environ[ROOTS_ENV] = json.dumps([str(r) for r in roots])  # the flow runs' subprocesses inherit it
    os.chdir(REPO)  # the flow runs' subprocesses import the flows from here
    # a run asked for (the UI, the API) starts within 2 s: Prefect's runner looks for scheduled runs
    # every 10 s by default, a wait on every click for a query that costs the local server nothing
    serve(*deployments(), print_starting_message=True, query_seconds=2)


def serve_command(host: str, port: int, url: str | None, roots: list[str], say: Callable[..., None]) -> None:
    """``bloomline serve``: start a server on ``host:port`` that requires an auth string (or use the
    one at ``url``, which must require it), say how to reach it, and serve the deployments until
    stopped; the server started here stops with it. ``say(text, warning=False)`` prints a line as
    given (no markup read in paths and URLs)."""
    from flows.run import serve_state

    auth, source = serve_state.auth_string()
    # before Prefect is imported: this process's client and the flow runs it starts send it
    os.environ["PREFECT_API_AUTH_STRING"] = auth
    server = None
    if url is None:
        if host not in serve_state.LOOPBACK:
            say(
                f"warning: the Prefect server listens on {host}, reachable beyond this machine over plain "
                "HTTP, which carries the auth string in clear: put a TLS proxy in front",
                warning=True,
            )
        home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect"))
        server = start_server(host, port, home / "bloomline-server.log", auth)
        url = api_url(host, port)
    try:
        wait_healthy(url, server)  # its exit (the port taken) ends serve: what answers is not it
        require_auth(url, auth, local=server is not None)
        os.environ["PREFECT_API_URL"] = url
        serve_state.write_marker(url)  # the user's other commands report here (flows/run/api_server.py)
        _say_how_to_reach(url, source, roots, say)
        serve_deployments(roots)
    finally:
        serve_state.remove_marker()
        if server is not None:
            stop(server)


def _say_how_to_reach(url: str, source: str, roots: list[str], say: Callable[..., None]) -> None:
    import shlex

    from flows.run import serve_state

    flows = ", ".join(f"{f}/{DEPLOYMENT}" for f in ("pipeline", "prepare", "train", "evaluate"))
    say(f"Prefect server {url.removesuffix('/api')} (UI); deployments: {flows}")
    key = f"${source}" if source in serve_state.GIVEN else f"$(cat {shlex.quote(source)})"
    say(f"auth string: {source} (the UI asks for it; clients send it as PREFECT_API_AUTH_STRING)")
    say("runs may use only: " + ", ".join(map(str, roots)))
    say(
        f'run one: PREFECT_API_URL={url} PREFECT_API_AUTH_STRING="{key}" '
        f"prefect deployment run 'pipeline/{DEPLOYMENT}' -p out={shlex.quote(roots[0].rstrip('/') + '/run1')}"
    )
