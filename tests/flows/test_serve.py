"""`bloomline serve` with its real Prefect server: it requires its auth string, the deployments are
registered, a run of one started through Prefect's client API completes, and its state and
artifacts read back; a run's parameters stay within the roots serve was given."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_requires_its_auth_string_and_runs_only_what_its_roots_allow(tmp_path, monkeypatch):
    """One `bloomline serve` (its own server, with an auth string it makes and keeps mode 0600):
    a request without the string is refused (anyone who reaches the API could otherwise run code
    as the serving user); a run of a deployment started with it completes and its state and
    artifacts read back; a run naming a Dask scheduler, or a folder outside --root, fails in one
    line before it touches anything; and the user's other commands find and adopt the server."""
    from flows.run import api_server, serve_state
    from flows.serve import stop, wait_healthy
    from training.loop.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_API_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        BLOOMLINE_HOME=str(home),
    )
    root = tmp_path / "runs"
    root.mkdir()
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.app", "serve", "--port", str(port), "--root", str(root)],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(url)
        auth = home / "serve" / "auth"
        assert stat.S_IMODE(auth.stat().st_mode) == 0o600 and stat.S_IMODE(auth.parent.stat().st_mode) == 0o700
        secret = auth.read_text().strip()
        assert serve_state.status(url, None) == 401  # the API without the auth string
        assert serve_state.status(url, "a guess") == 401
        assert serve_state.status(url, secret) == 200
        assert secret not in serve_log.read_text(errors="replace")  # named by its file, never shown

        out, outside = root / "prepared", tmp_path / "outside"
        script = f"""
import asyncio, json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from flows.serve import default_parameters

async def main():
    async with get_client() as client:
        for _ in range(240):  # until `bloomline serve` has registered its deployments
            names = sorted(d.name for d in await client.read_deployments())
            flows = {{f.id: f.name for f in await client.read_flows()}}
            if len(names) >= 4:
                break
            await asyncio.sleep(0.5)
        deps = sorted(flows[d.flow_id] + "/" + d.name for d in await client.read_deployments())
    config = default_parameters()["prepare"]["config"]
    config["dask"]["address"] = "tcp://127.0.0.1:9"
    runs = {{
        "ok": await run_deployment("prepare/bloomline", parameters={{"out": {str(out)!r}}}, timeout=600, poll_interval=1),
        "dask": await run_deployment("prepare/bloomline", parameters={{"out": {str(out)!r} + "-dask", "config": config}}, timeout=600, poll_interval=1),
        "outside": await run_deployment("prepare/bloomline", parameters={{"out": {str(outside)!r}}}, timeout=600, poll_interval=1),
    }}
    got = {{"deployments": deps}}
    async with get_client() as client:
        for name, run in runs.items():
            run = await client.read_flow_run(run.id)
            arts = await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            states = await client.read_flow_run_states(run.id)  # a failed served run may end Crashed after it
            got[name] = {{"state": run.state.type.value, "messages": [s.message or "" for s in states], "artifacts": sorted(a.key for a in arts if a.key)}}
    print(json.dumps(got))

asyncio.run(main())
"""
        client_env = {**env, "PREFECT_API_URL": url, "PREFECT_API_AUTH_STRING": secret}
        res = subprocess.run(
            [sys.executable, "-c", script], env=client_env, cwd=REPO, capture_output=True, text=True, timeout=900
        )
        assert res.returncode == 0, res.stderr[-3000:] + serve_log.read_text(errors="replace")[-3000:]
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["deployments"] == [
            "evaluate/bloomline",
            "pipeline/bloomline",
            "prepare/bloomline",
            "train/bloomline",
        ]
        assert got["ok"]["state"] == "COMPLETED", serve_log.read_text(errors="replace")[-3000:]
        assert "prepare-summary" in got["ok"]["artifacts"]
        assert (out / "manifest.json").is_file()
        for name, key in (("dask", "config.dask.address"), ("outside", "out")):
            assert got[name]["state"] in ("FAILED", "CRASHED"), got[name]
            assert any(f"BloomlineError: parameter '{key}' refused: " in m for m in got[name]["messages"]), got[name]
        assert not outside.exists() and not Path(f"{out}-dask").exists()  # refused before anything was made

        # the user's other commands report to it, with its auth string
        for name in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
        monkeypatch.setenv("BLOOMLINE_HOME", str(home))
        monkeypatch.setattr(api_server, "_server", {})
        assert api_server.start_early() == f"running {url}"
        assert os.environ["PREFECT_API_AUTH_STRING"] == secret
    finally:
        stop(proc)
    assert not (home / "serve" / "server.json").exists()  # serve's marker goes with it


def refused_serve(tmp_path, answer, *args, **env):
    """`bloomline serve ARGS` (PREFECT_API_* unset, ``env`` added) beside a loopback server that
    answers each GET with ``answer(path, authorization)``, its port as ``{port}`` in ``args``:
    the result and the Authorization headers the server was sent."""
    from tests.support.prefect import http_server

    server = http_server(answer)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_API_"))}
    full.update(BLOOMLINE_HOME=str(tmp_path), **env)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "flows.cli.app", "serve", *(a.format(port=server.server_port) for a in args)],
            env=full,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
    return res, server.seen


def test_an_existing_server_without_authentication_is_refused(tmp_path):
    """`serve --api-url` on a server anyone reaching it can use: one line, exit 2, nothing served."""
    res, _ = refused_serve(tmp_path, lambda path, header: 200, "--api-url", "http://127.0.0.1:{port}/api")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "answers requests without authentication" in lines[0], res.stderr


def test_a_port_another_process_holds_is_sent_no_auth_string(tmp_path):
    """`serve` on a port something already listens on (another user's squatter would answer
    /health, and then get the auth string and the deployments): one line, exit 2, and the
    squatter is sent no credentials."""
    from tests.support.prefect import AUTH, prefect_like

    res, seen = refused_serve(  # the squatter would take AUTH, as a server started with it does
        tmp_path,
        prefect_like,
        "--port",
        "{port}",
        "--root",
        str(tmp_path),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_API_AUTH_STRING=AUTH,
    )
    assert not any(seen), seen  # no Authorization header reached it
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "already in use" in lines[0], res.stderr[-2000:]


def test_a_started_server_that_exited_is_not_waited_for_elsewhere(tmp_path):
    """The server serve started exited (its port taken in between): whatever answers /health
    there is not it, and serve ends in one line rather than sending it the auth string."""
    from bloomline.errors import BloomlineError
    from flows.serve import wait_healthy
    from tests.support.prefect import http_server

    squatter = http_server(lambda path, header: 200)
    exited = subprocess.Popen(["true"])
    exited.wait()
    try:
        with pytest.raises(BloomlineError, match=r"^the Prefect server exited \(code 0\) before it answered at "):
            wait_healthy(squatter.url, exited, timeout=5)
    finally:
        squatter.shutdown()
    assert squatter.seen == []


def test_served_parameters_are_checked_against_the_roots(tmp_path, monkeypatch):
    """The check every flow's arguments pass first under serve (flows/run/served.py), in-process: each
    setting typed as a location, found from the flows' and recipes' types."""
    from bloomline.errors import BloomlineError
    from flows.run import served
    from flows.serve import default_parameters
    from flows.stages.evaluate import evaluate_flow
    from flows.stages.pipeline import pipeline
    from flows.stages.prepare import prepare
    from flows.stages.train import train

    root = tmp_path / "runs"
    (root / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")
    bucket = "s3://team-bucket/runs"
    params = default_parameters()
    flows = {"pipeline": pipeline, "prepare": prepare, "train": train, "evaluate": evaluate_flow}

    def check(flow, args):
        served.check(args, served.parameters_of(flows[flow]))

    ok = {"recipe": params["train"]["recipe"], "data": str(root / "data"), "out": str(root / "run1"), "local": None}
    check("train", ok)  # outside serve, nothing is checked...
    monkeypatch.setenv(served.ROOTS_ENV, json.dumps([str(root), bucket]))
    check("train", ok)  # ...and the bundled recipes pass under it
    check("pipeline", {"config": params["pipeline"]["config"], "out": str(root / "p")})
    check(
        "train", {"recipe": {**params["train"]["recipe"], "model": "bloom-tiny"}, "data": str(root), "out": str(root)}
    )
    check("evaluate", {"checkpoint": str(root / "run1/checkpoints/step_10"), "data": str(root / "data"), "out": None})
    mirrored = json.loads(json.dumps(params["train"]["recipe"]))
    mirrored["checkpoint"]["mirror"] = f"{bucket}/mirror"  # under a URL root
    check("train", {"recipe": mirrored, "data": f"{bucket}/data", "out": str(root)})

    pipeline_cfg = json.loads(json.dumps(params["pipeline"]["config"]))
    pipeline_cfg["train"]["launch"]["nccl"]["NCCL_NET_PLUGIN"] = "/tmp/x.so"

    def recipe(**over):
        r = json.loads(json.dumps(params["train"]["recipe"]))
        for dotted, value in over.items():
            node = r
            *parents, last = dotted.split("__")
            for p in parents:
                node = node[p]
            node[last] = value
        return {"recipe": r, "data": str(root), "out": str(root)}

    def nccl(name, value):
        return recipe(launch__nccl={"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "INFO", name: value})

    check("train", nccl("NCCL_SOCKET_IFNAME", "eth0"))  # a setting that names no file passes
    refused = {
        "out": ("prepare", {"out": str(tmp_path / "elsewhere")}),
        "out.": ("prepare", {"out": str(root / "link" / "x")}),  # a link out of the root
        "out..": ("prepare", {"out": str(root / ".." / "elsewhere")}),
        "out...": ("prepare", {"out": "s3://other-bucket/x"}),  # a URL under no URL root
        "out....": ("prepare", {"out": f"{bucket}/../../other/x"}),  # stepping out of one
        "out.....": ("prepare", {"out": f"{bucket}-evil/x"}),  # a prefix of the name is not a folder of it
        "checkpoint": ("evaluate", {"checkpoint": "/etc/passwd", "out": str(root)}),
        "checkpoint.": ("evaluate", {"checkpoint": str(root / "step_10"), "out": None}),  # its run folder
        "config.sources[0].path": ("prepare", {"config": {"sources": [{"path": "/etc"}]}, "out": str(root)}),
        "config.tokenizer.model": ("prepare", {"config": {"tokenizer": {"model": "/etc/x"}}, "out": str(root)}),
        "config.decontaminate.tasks[0].data": (
            "prepare",
            {"config": {"decontaminate": {"tasks": [{"name": "x", "data": "/etc"}]}}, "out": str(root)},
        ),
        "config.tasks[0].data": ("evaluate", {"config": {"tasks": [{"data": "/etc"}]}, "checkpoint": str(root)}),
        "recipe.model": ("train", {"recipe": {"model": "../../etc/x.yaml"}, "out": str(root)}),
        "recipe.train.init_from": ("train", recipe(train__init_from="/home/someone/weights")),
        "recipe.checkpoint.mirror": ("train", recipe(checkpoint__mirror="s3://attacker/uploads")),
        "recipe.evaluation.settings.heldout": ("train", recipe(evaluation__settings__heldout="/etc")),
        "config.dask.address": ("prepare", {"config": {"dask": {"address": "tcp://10.0.0.1:8786"}}, "out": str(root)}),
        "config.data.dask.address": (
            "pipeline",
            {"config": {"data": {"dask": {"address": "tcp://h:1"}}}, "out": str(root)},
        ),
        "recipe.launch.launcher_args": ("train", recipe(launch__launcher_args="-R exec")),
        "config.train.launch.nccl.NCCL_NET_PLUGIN": ("pipeline", {"config": pipeline_cfg, "out": str(root)}),
        # NCCL writes these paths, reads more variables from this one, adds a variable on a new line
        "recipe.launch.nccl.NCCL_DEBUG_FILE": ("train", nccl("NCCL_DEBUG_FILE", str(root / "x"))),
        "recipe.launch.nccl.NCCL_TOPO_DUMP_FILE": ("train", nccl("NCCL_TOPO_DUMP_FILE", str(root / "x"))),
        "recipe.launch.nccl.NCCL_GRAPH_DUMP_FILE": ("train", nccl("NCCL_GRAPH_DUMP_FILE", str(root / "x"))),
        "recipe.launch.nccl.NCCL_CONF_FILE": ("train", nccl("NCCL_CONF_FILE", str(root / "nccl.conf"))),
        "recipe.launch.nccl.NCCL_DEBUG": ("train", nccl("NCCL_DEBUG", "INFO\nLD_PRELOAD=/tmp/x.so")),
    }
    for key, (flow, args) in refused.items():
        with pytest.raises(BloomlineError, match=rf"^parameter '{re.escape(key.rstrip('.'))}' refused: "):
            check(flow, args)


def test_every_setting_that_names_a_path_or_url_is_checked_by_its_type():
    """The list comes from the types: a location setting added to a recipe is in it unwritten."""
    from flows.run import served
    from training.config import TrainRecipe

    keys = served.location_keys(TrainRecipe)
    for k in ("model", "train.init_from", "checkpoint.mirror", "launch.hostfile", "evaluation.settings.tasks[].data"):
        assert k in keys, k


def test_the_api_address_of_each_host():
    """An IPv6 host goes in brackets (``http://::1:4200/api`` is no URL: the server was waited for
    180 s, then given up on); a wildcard is reached through loopback."""
    from flows.serve import api_url

    assert api_url("::1", 4200) == "http://[::1]:4200/api"
    assert api_url("::", 4200) == "http://[::1]:4200/api"
    assert api_url("0.0.0.0", 4200) == "http://127.0.0.1:4200/api"
    assert api_url("127.0.0.1", 4300) == "http://127.0.0.1:4300/api"
    assert api_url("fe80::1", 80) == "http://[fe80::1]:80/api"
