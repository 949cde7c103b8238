"""Prefect servers for the tests: :func:`own_server`, the environment of a command that starts a
Prefect server of its own, not the session's (tests/conftest.py ``prefect_server``); and a stand-in
on loopback, :func:`http_server`, which answers each GET as its ``answer`` says and records the
Authorization headers it was sent, with :func:`prefect_like`, the answers of a Prefect server
guarded by the auth string ``AUTH``. For the tests of which server a command's flows report to
(tests/flows/run/test_api_server.py) and of ``bloomline serve``."""

from __future__ import annotations

import base64
import http.server
import os
import threading
from pathlib import Path

SHARED = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")


def own_server(env: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    """``env`` (else this process's environment) less the session server's variables, so the
    command starts its temporary server as a user's would; ``home``: its ``PREFECT_HOME``, where that
    server keeps its database."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k not in SHARED}
    if home is not None:
        out["PREFECT_HOME"] = str(home)
    return out


AUTH = "the-users-own-auth-string"


def http_server(answer):
    """A server on a free loopback port; ``answer(path, authorization header)`` gives each GET's
    status. Records the Authorization headers it was sent in ``.seen``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            httpd.seen.append(self.headers.get("Authorization"))
            self.send_response(answer(self.path, self.headers.get("Authorization")))
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    httpd.seen = []
    httpd.url = f"http://127.0.0.1:{httpd.server_port}/api"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def prefect_like(path, header):
    """Prefect's server with an auth string: /api/health open, the rest behind Basic auth."""
    if path == "/api/health":
        return 200
    return 200 if header == "Basic " + base64.b64encode(AUTH.encode()).decode() else 401
