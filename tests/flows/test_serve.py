"""`bloomline serve` against a real `prefect server`: the deployments are registered, a run of one
started through Prefect's client API completes, and its state and artifacts read back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_deployment_runs_on_a_real_prefect_server(tmp_path):
    from training.loop.launch import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": url,
    }
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        from flows.serve import wait_healthy

        wait_healthy(url)
        serve_log = tmp_path / "serve.log"
        with open(serve_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "flows.cli", "serve", "--api-url", url],
                    env=env,
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        out = tmp_path / "prepared"
        script = f"""
import asyncio, json, time
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment

async def main():
    async with get_client() as client:
        for _ in range(240):  # until `bloomline serve` has registered its deployments
            names = sorted(d.name for d in await client.read_deployments())
            flows = {{f.id: f.name for f in await client.read_flows()}}
            if len(names) >= 4:
                break
            await asyncio.sleep(0.5)
        deps = sorted(flows[d.flow_id] + "/" + d.name for d in await client.read_deployments())
    run = await run_deployment("prepare/bloomline", parameters={{"out": {str(out)!r}}}, timeout=600)
    async with get_client() as client:
        run = await client.read_flow_run(run.id)
        arts = await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    print(json.dumps({{"deployments": deps, "state": run.state.type.value, "artifacts": sorted(a.key for a in arts if a.key)}}))

asyncio.run(main())
"""
        res = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )
        assert res.returncode == 0, res.stderr[-3000:] + serve_log.read_text(errors="replace")[-3000:]
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["deployments"] == [
            "evaluate/bloomline",
            "pipeline/bloomline",
            "prepare/bloomline",
            "train/bloomline",
        ]
        assert got["state"] == "COMPLETED", serve_log.read_text(errors="replace")[-3000:]
        assert "prepare-summary" in got["artifacts"]
        assert (out / "manifest.json").is_file()
    finally:
        from flows.serve import stop

        for p in procs[::-1]:
            stop(p)


def test_the_api_address_of_each_host():
    """An IPv6 host goes in brackets (``http://::1:4200/api`` is no URL: the server was waited for
    180 s, then given up on); a wildcard is reached through loopback."""
    from flows.serve import api_url

    assert api_url("::1", 4200) == "http://[::1]:4200/api"
    assert api_url("::", 4200) == "http://[::1]:4200/api"
    assert api_url("0.0.0.0", 4200) == "http://127.0.0.1:4200/api"
    assert api_url("127.0.0.1", 4300) == "http://127.0.0.1:4300/api"
    assert api_url("fe80::1", 80) == "http://[fe80::1]:80/api"
