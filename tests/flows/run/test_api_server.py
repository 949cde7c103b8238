"""Which Prefect server a command's flows report to, found or started early (flows/run/api_server.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.run import api_server, serve_state
from tests.support.prefect import AUTH, http_server, prefect_like

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    # set, then removed: the undo puts the variable back as it was, also when start_early sets it
    # (a delenv of an absent variable records nothing to undo, and the URL of this test's server
    # would reach every later test's CLI runs)
    for name in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("BLOOMLINE_HOME", str(tmp_path / "home"))  # no marker of a running serve
    # a command that adopts nothing may not start a server here: start_early says "configured"
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_ENABLED", "false")
    monkeypatch.setattr(api_server, "_server", {})


def mark(url):
    """What a running `bloomline serve` leaves: its auth string and its server's URL, mode 0600."""
    serve_state.write_private(serve_state.auth_file(), AUTH + "\n")
    serve_state.write_marker(url)


def test_a_configured_server_is_used_as_it_is(fresh, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://example.invalid:4200/api")
    assert api_server.start_early() == "configured"
    assert not api_server._server and "PREFECT_API_AUTH_STRING" not in os.environ
    api_server.wait_ready()  # nothing to wait for


def test_the_users_own_bloomline_serve_is_used_with_its_auth_string(fresh):
    httpd = http_server(prefect_like)
    try:
        mark(httpd.url)
        assert api_server.start_early() == f"running {httpd.url}"
        assert os.environ["PREFECT_API_URL"] == httpd.url and not api_server._server
        assert os.environ["PREFECT_API_AUTH_STRING"] == AUTH
    finally:
        httpd.shutdown()


@pytest.mark.parametrize(
    "squatter",
    [
        lambda path, header: 200,  # answers everything, as a port squatter would
        lambda path, header: 200 if path == "/api/health" else 401,  # refuses everyone
    ],
)
def test_a_squatter_on_the_port_of_a_serve_is_not_adopted(fresh, squatter):
    """A process squatting the port a `bloomline serve` used (it stopped; any local user can
    take the port) would receive every run's logs and artifacts and could cancel runs."""
    httpd = http_server(squatter)
    try:
        mark(httpd.url)
        assert api_server.start_early() == "configured"  # not adopted (and no server may start here)
        assert "PREFECT_API_URL" not in os.environ and "PREFECT_API_AUTH_STRING" not in os.environ
    finally:
        httpd.shutdown()


def test_a_server_of_another_user_is_sent_nothing(fresh, monkeypatch):
    """Every listener on the port must be this user's before the auth string goes anywhere."""
    httpd = http_server(prefect_like)
    try:
        assert serve_state.listener_uids(httpd.server_port) == [os.getuid()]  # read from /proc/net/tcp
        mark(httpd.url)
        # as the kernel reports a listener another user opened on the same port (IPv6 wildcard)
        monkeypatch.setattr(serve_state, "listener_uids", lambda port: [os.getuid(), os.getuid() + 1])
        assert api_server.start_early() == "configured"
        assert httpd.seen == [] and "PREFECT_API_URL" not in os.environ
    finally:
        httpd.shutdown()


def test_a_marker_others_can_write_is_not_read(fresh):
    httpd = http_server(prefect_like)
    try:
        mark(httpd.url)
        serve_state.marker_file().chmod(0o644)
        assert api_server.start_early() == "configured" and httpd.seen == []
    finally:
        httpd.shutdown()


def test_a_configured_serve_server_gets_the_kept_auth_string(fresh, monkeypatch):
    httpd = http_server(prefect_like)
    try:
        mark(httpd.url)
        monkeypatch.setenv("PREFECT_API_URL", httpd.url)
        assert api_server.start_early() == "configured"
        assert os.environ["PREFECT_API_AUTH_STRING"] == AUTH
        monkeypatch.setenv("PREFECT_API_URL", "https://api.prefect.cloud/api/accounts/x/workspaces/y")
        monkeypatch.delenv("PREFECT_API_AUTH_STRING")
        assert api_server.start_early() == "configured"
        assert "PREFECT_API_AUTH_STRING" not in os.environ  # never sent to another server
    finally:
        httpd.shutdown()


def test_the_temporary_server_is_used_only_once_proven_its_own(fresh, monkeypatch):
    """A process that took the temporary server's free port before uvicorn bound it answers
    there: it is not used, and the command ends in one line (uvicorn exits, or never answers as
    the server started here would)."""
    from bloomline.errors import BloomlineError

    squatter = http_server(lambda path, header: 200)  # answers anything, /health included
    dead = subprocess.Popen(["true"])  # uvicorn, exited ("address in use")
    dead.wait()
    alive = subprocess.Popen(["sleep", "30"])  # uvicorn, still starting
    try:
        monkeypatch.setattr(api_server, "_server", {"proc": dead, "url": squatter.url, "auth": AUTH})
        with pytest.raises(
            BloomlineError, match=r"^the temporary Prefect server exited with code 0 before it answered$"
        ):
            api_server.wait_ready(timeout=5)
        api_server._server["proc"] = alive
        with pytest.raises(BloomlineError, match=r"^the temporary Prefect server at \S+ was not proven its own within"):
            api_server.wait_ready(timeout=0.5)
        assert not any(squatter.seen)  # never sent the auth string
    finally:
        alive.kill()
        alive.wait()
        squatter.shutdown()


@pytest.mark.slow
def test_the_temporary_server_starts_at_once_answers_and_stops(tmp_path):
    """Started before Prefect is imported, named in PREFECT_API_URL, which the flow then uses;
    only a client with its auth string (this process's) gets past its health check."""
    code = """
import os, sys
from flows.run import api_server as a, serve_state
how = a.start_early()
assert "prefect" not in sys.modules and how.startswith("temporary "), how
a.wait_ready()
url = how.split()[1]
assert serve_state.status(url, None) == 401, "another user's request got in"
assert serve_state.status(url, os.environ["PREFECT_API_AUTH_STRING"]) == 200
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
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["BLOOMLINE_HOME"] = str(tmp_path)  # no running serve's marker
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
