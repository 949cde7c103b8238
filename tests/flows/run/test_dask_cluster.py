"""The Dask cluster a preparation runs on (flows/run/dask_cluster.py)."""

import json
import os
from pathlib import Path

from bloomline.config import load_config
from data_prep.config import PrepareConfig
from flows.run.dask_cluster import dask_client

REPO = Path(__file__).resolve().parents[3]


def test_a_local_cluster_leaves_the_drivers_environment_as_it_was():
    """Dask's nannies set OMP_NUM_THREADS=1 and more in the process that starts them; the ranks
    of a pipeline's training inherited them when its data had just been prepared, and trained on
    another number of threads than a rerun that reused the data (different gradients)."""
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", ["dask.n_workers=1"])
    before = dict(os.environ)
    with dask_client(cfg) as client:
        assert client.submit(lambda: os.environ.get("OMP_NUM_THREADS")).result() == "1"  # the workers keep Dask's
        # the workers run quiet: no profiler thread sampling the tasks for a dashboard nobody sees
        quiet = client.run(lambda: __import__("dask").config.get("distributed.worker.profile.enabled"))
        assert list(quiet.values()) == [False]
        # and with glibc's adaptive malloc: Dask's MALLOC_TRIM_THRESHOLD_ made numpy steps 2x slower
        if "MALLOC_TRIM_THRESHOLD_" not in before:
            assert client.submit(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).result() is None
    assert dict(os.environ) == before


def test_the_local_cluster_refuses_a_client_without_its_credentials():
    """Any user of the host can reach a loopback port; a plain Dask scheduler runs whatever
    functions its clients send, as the job's user. Only the cluster's own TLS credentials get in:
    a plain TCP client and a TLS client with other (self-signed) credentials are both refused."""
    from distributed import Client
    from distributed.security import Security

    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", ["dask.n_workers=1"])
    with dask_client(cfg) as client:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(lambda: 1 + 1).result() == 2  # the job's own client and worker get through
        for kind, addr, sec in (
            ("plain", address.replace("tls://", "tcp://"), None),
            ("other credentials", address, Security.temporary()),
        ):
            try:
                with Client(addr, security=sec, timeout="3s") as intruder:
                    intruder.submit(lambda: 0).result(timeout=3)
            except (OSError, TimeoutError):
                continue
            raise AssertionError(f"a {kind} client reached the cluster at {addr}")


def test_a_local_clusters_processes_are_quiet_from_their_first_import():
    """Every process a local cluster spawns has Dask's connection chatter at WARNING as soon as it
    imports ``distributed``, before any worker callback could run: a worker torn down while still
    starting logged "Batched Comm Closed" with a traceback into the command's output (CI)."""
    import logging
    import subprocess
    import sys

    from data_prep.config import PrepareConfig
    from flows.run.dask_cluster import QUIET, dask_client

    probe = "import distributed, logging, json; print(json.dumps([logging.getLogger(n).level for n in %r]))" % (QUIET,)
    cfg = PrepareConfig()
    cfg.dask.n_workers = 1
    with dask_client(cfg):  # what the nannies spawn inherits this environment
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [logging.WARNING] * len(QUIET)
    after = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(after)[QUIET.index("distributed.batched")] == logging.NOTSET  # the driver's environment as before
