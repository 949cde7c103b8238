"""Where a command's flows report to: the Prefect server, found or started before it is needed.

Prefect starts its temporary server when a flow first calls its API, and waits for it: about
4 s on 2 cores, while the command does nothing else. A command calls :func:`start_early` as
soon as its recipe is read (``prepare``: and its inputs found), and :func:`wait_ready` just
before its first flow; between the two, the command checks its inputs against the recipe (a
checkpoint's parameters, the data's vocabulary: torch imports), imports its stages and starts
its Dask cluster while the server starts in its own process. A command refused there stops the
server at exit, still starting. The server is, in order:

1. the one ``PREFECT_API_URL`` names (Prefect's own setting; nothing to start). When it is the
   server of a running ``bloomline serve`` of this user's (as 2. proves it), the auth string
   that serve keeps is sent to it (``PREFECT_API_AUTH_STRING``, unless set);
2. the server of a running ``bloomline serve`` of this user's, named in the marker file serve
   writes (flows/run/serve_state.py), once proven the user's own: every socket listening on its port
   is this user's, and it refuses a request without serve's auth string and answers one with it
   (a team that keeps one running gets its runs in that UI, and skips the start). A server that
   merely answers on 127.0.0.1:4200 is not adopted: any local user could have taken the port,
   and would receive every run's logs and artifacts and could cancel its runs;
3. else the temporary server Prefect would start (its ``SubprocessASGIServer`` command: uvicorn
   on Prefect's app factory, UI off, the ephemeral settings), started here at once and given to
   Prefect as ``PREFECT_API_URL``; stopped when the command exits. Starting it here, rather than
   through Prefect's class, spares the command importing Prefect's server (~1.5 s) before the
   server process can even begin. It requires an auth string made for it (given to this
   process's Prefect client as ``PREFECT_API_AUTH_STRING``), so another user on the host cannot
   read the runs' logs and artifacts from its loopback port. It is used once proven the one
   started here (:func:`wait_ready`): its process alive, and the port's listener proven this
   user's as in 2. A process that took its free port before it bound it gets nothing: the command
   ends in one line.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from bloomline.errors import BloomlineError
from flows.run import serve_state

_server: dict = {}  # the temporary server this process started: {"proc", "url", "auth"}


def start_early() -> str:
    """Find or start the server (see the module's docstring); returns which: ``"configured"``,
    ``"running <url>"`` or ``"temporary <url>"``. Call before Prefect is imported: the server is
    set as ``PREFECT_API_URL`` in the environment, which Prefect reads when it loads."""
    if _server:
        return f"temporary {_server['url']}"
    served, auth = serve_state.marked_url(), serve_state.kept_auth_string()
    ours = served is not None and auth is not None and serve_state.owned_server(served, auth)
    if os.environ.get("PREFECT_API_URL"):
        if ours and os.environ["PREFECT_API_URL"].rstrip("/") == served.rstrip("/"):
            os.environ.setdefault("PREFECT_API_AUTH_STRING", auth)
        return "configured"
    if ours:
        os.environ["PREFECT_API_URL"] = served
        os.environ["PREFECT_API_AUTH_STRING"] = auth
        return f"running {served}"
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "true").lower() in ("0", "false", "no"):
        return "configured"  # no server allowed to start: Prefect says what is missing, at the first flow
    _start_temporary()
    os.environ["PREFECT_API_URL"] = _server["url"]
    return f"temporary {_server['url']}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_temporary() -> None:
    port = _free_port()
    app_dir = Path(importlib.util.find_spec("prefect").submodule_search_locations[0]).parent
    auth = secrets.token_urlsafe(32)
    env = {
        **os.environ,
        # as Prefect's SubprocessASGIServer runs it: no UI, the ephemeral server's services
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_API_AUTH_STRING": auth,
    }
    # this process's Prefect client, and every process it starts (ranks, watcher, workers), sends it
    os.environ["PREFECT_API_AUTH_STRING"] = auth
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "--factory"]
        + ["prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port)]
        + ["--log-level", "error", "--lifespan", "on"],
        env=env,
        # not in the terminal's process group: Ctrl-C reaches the driver, which ends the job's
        # processes in order (flows/run/interrupt.py), rather than the server dying under a running flow
        start_new_session=True,
    )
    _server.update(proc=proc, url=f"http://127.0.0.1:{port}/api", auth=auth)
    atexit.register(stop)


def wait_ready(timeout: float | None = None) -> None:
    """Until the temporary server :func:`start_early` started is proven to answer on its port (at
    once if it started none): its process alive, and :func:`serve_state.owned_server` (every
    listener on the port this user's, 401 without its auth string, 200 with it). Else a
    BloomlineError: whatever else answers there (a process that took the free port between
    :func:`_free_port` and uvicorn binding it) is sent nothing more."""
    if not _server:
        return
    limit = timeout or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
    deadline = time.monotonic() + limit
    while True:
        code = _server["proc"].poll()  # first: a dead server's port answers for someone else
        if code is not None:  # 3: uvicorn's "address in use" (the free port taken in between)
            raise BloomlineError(f"the temporary Prefect server exited with code {code} before it answered")
        if serve_state.owned_server(_server["url"], _server["auth"]):
            return
        if time.monotonic() > deadline:
            raise BloomlineError(
                f"the temporary Prefect server at {_server['url']} was not proven its own within {limit:.0f} s"
            )
        time.sleep(0.05)


def stop() -> None:
    """Stop the temporary server (at exit): SIGTERM, then SIGKILL after 5 s, as Prefect does."""
    proc = _server.get("proc")
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
