"""Which Prefect server a command's flows report to, found or started early (flows/api_server.py)."""

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flows import api_server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch):
    # set, then removed: the undo puts the variable back as it was, also when start_early sets it
    # (a delenv of an absent variable records nothing to undo, and the URL of this test's server
    # would reach every later test's CLI runs)
    monkeypatch.setenv("PREFECT_API_URL", "")
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setattr(api_server, "_server", {})
    monkeypatch.setattr(api_server, "SERVE_URL", "http://127.0.0.1:9/api")  # nothing listens there


def test_a_configured_server_is_used_as_it_is(fresh, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://example.invalid:4200/api")
    assert api_server.start_early() == "configured"
    assert not api_server._server
    api_server.wait_ready()  # nothing to wait for


def test_a_server_answering_where_bloomline_serve_listens_is_used(fresh, monkeypatch):
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/api"
        monkeypatch.setattr(api_server, "SERVE_URL", url)
        assert api_server.start_early() == f"running {url}"
        assert os.environ["PREFECT_API_URL"] == url and not api_server._server
    finally:
        httpd.shutdown()


@pytest.mark.slow
def test_the_temporary_server_starts_at_once_answers_and_stops():
    """Started before Prefect is imported, named in PREFECT_API_URL, which the flow then uses."""
    code = """
import os, sys
from flows import api_server as a
a.SERVE_URL = "http://127.0.0.1:9/api"
how = a.start_early()
assert "prefect" not in sys.modules and how.startswith("temporary "), how
a.wait_ready()
from prefect import flow
@flow
def f():
    from prefect.context import get_run_context
    return str(get_run_context().client.api_url)
assert f().rstrip("/") == os.environ["PREFECT_API_URL"] == how.split()[1], (f(), how)
a.stop()
assert a._server["proc"].poll() is not None
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
