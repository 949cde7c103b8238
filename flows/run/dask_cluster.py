"""The Dask cluster a preparation runs on, and what its workers run besides the stages' tasks.

Kept apart from the Prefect flow (flows/stages/prepare.py): a worker process unpickles the functions it
is sent by importing their module, and this one imports neither Prefect nor the flows (~1.5 s of
imports in each worker, while Prefect's server starts on the same cores).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import dask

from bloomline.secrets import install_log_masking
from data_prep.config import PrepareConfig

# Dask's INFO chatter (workers starting, connections) would drown the stage progress. Among it,
# "Batched Comm Closed" comes with a traceback (distributed/batched.py logs it at INFO with
# exc_info) when a connection closes as the cluster is torn down: on a run that stopped with a
# one-line error (a full disk), that traceback reached the command's output (seen in CI).
QUIET = (
    "distributed",
    "distributed.scheduler",
    "distributed.nanny",
    "distributed.core",
    "distributed.worker",
    "distributed.batched",
)
for _name in QUIET:
    logging.getLogger(_name).setLevel(logging.WARNING)
QUIET_ENV = {"DASK_LOGGING": repr({name: "warning" for name in QUIET})}
"""The same levels for every process a local cluster spawns, in the environment that Dask's config
reads when ``distributed`` is imported there (``DASK_LOGGING={'distributed.batched': …}``: one
variable holding the mapping, as a logger's name has dots that ``DASK_LOGGING__X`` would split). A worker callback (:func:`_worker_logs`) runs only once the worker is
up: a cluster torn down while a worker was still starting (a prepare stopped at once by a full
disk) let that worker's "Batched Comm Closed" traceback reach the command's output (CI, issue 48)."""


def _ignore_terminal_interrupt(worker: Any = None) -> None:
    """A local worker is in the terminal's process group, so Ctrl-C reaches it as well as the
    driver; left to itself it dies there, mid-task, with a traceback of its own. The driver ends
    the job's processes itself (flows/run/interrupt.py), so the worker ignores SIGINT (set in its main
    thread: Dask runs worker callbacks on the worker's event loop, which is its main thread)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_logs(worker: Any = None) -> None:
    """Every worker's log records masked (bloomline/secrets.py); and a task that found the disk
    full reported once, by the command's last line (flows/run/user_errors.py), not also by each
    worker's "Compute Failed" with its traceback."""
    from flows.run.user_errors import DiskFullFilter

    install_log_masking()
    logging.getLogger("distributed.batched").setLevel(logging.WARNING)  # as in the driver (QUIET)
    for name in ("distributed.worker", "distributed.core"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DiskFullFilter) for f in logger.filters):
            logger.addFilter(DiskFullFilter())


def _local_worker(worker: Any = None) -> None:
    """A local cluster's worker: :func:`_worker_logs`, and the terminal's Ctrl-C ignored."""
    _worker_logs(worker)
    _ignore_terminal_interrupt(worker)


@contextmanager
def environ_kept() -> Iterator[None]:
    """os.environ as it was before, afterwards. A LocalCluster's nannies run in this process and
    set ``distributed.nanny.pre-spawn-environ`` (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1,
    OPENBLAS_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED) in *this* process's
    environment before each worker starts, and leave them there: every process the driver
    starts afterwards inherited them, so the training ranks of a pipeline that had just prepared
    its data ran torch on one thread, and a rerun that reused the data on all of them, and their
    gradients differed in the last bits (issue 21)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for k in [k for k in os.environ if k not in before]:
            del os.environ[k]
        os.environ.update(before)


@contextmanager
def _quiet_spawns() -> Iterator[None]:
    """:data:`QUIET_ENV` in this process's environment while a local cluster spawns its processes
    (inside :func:`environ_kept`, which puts the environment back)."""
    os.environ.update(QUIET_ENV)
    yield


QUIET_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    # None unsets it: Dask's nannies start each worker with MALLOC_TRIM_THRESHOLD_=65536
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
}
"""What a local cluster's workers do beside their tasks, quieted, and glibc's malloc left as it
is. Setting any of glibc's malloc thresholds turns off its adaptive mmap threshold
(mallopt(3)), so with Dask's MALLOC_TRIM_THRESHOLD_ every array over 128 KiB is a fresh mmap
whose pages fault in again: the chunk steps' numpy passes over a batch ran 2x slower
(``dedup_sign``, 4 MB chunks in one process: 0.31 -> 0.81 s) and ``quality`` 1.4x. The
statistical profiler (a thread taking the GIL every 10 ms to sample stacks) feeds a dashboard
the local cluster does not start, and the event-loop tick (20 ms), memory and system monitors wake the worker's loop thread,
which takes the GIL from the task each time. Measured on the 4x corpus's first 8 chunks, 2
workers: the steps' seconds 12.4 on average with Dask's defaults, 9.9 quieted, 11.0 in a plain
process pool (runs vary by ±15% on this machine)."""


@contextmanager
def dask_client(cfg: PrepareConfig) -> Iterator[Any]:
    """A Dask client: the scheduler at ``dask.address``, else a LocalCluster of processes that
    only this client and the cluster's own processes can reach (TLS, credentials made for it); on
    every worker, log records are masked (bloomline/secrets.py) before Dask sees them. The
    driver's environment is the same after it as before (:func:`environ_kept`)."""
    from distributed import Client, LocalCluster

    if cfg.dask.address:
        with Client(cfg.dask.address) as client:
            client.register_worker_callbacks(_worker_logs)  # also on workers that join later
            yield client
        return
    # One single-threaded process per core: SentencePiece, fastText and the filters are
    # CPU-bound Python/C++ that holds the GIL for long stretches.
    # security=True: the scheduler, nannies, workers and this client speak TLS with credentials
    # made for this cluster (Dask's Security.temporary(), in memory, never on disk), and each end
    # requires the other's certificate. A loopback port is open to every user of the host, and
    # whoever connects to a plain Dask scheduler runs functions as this job's user (issue 37).
    # Measured (2 workers, median of 5, 2 busy cores): the start until both workers are ready
    # 0.81 -> 0.94 s, and with 200 small tasks after it 1.19 -> 1.34 s.
    with (
        environ_kept(),
        _quiet_spawns(),
        dask.config.set(QUIET_WORKERS),
        LocalCluster(
            n_workers=cfg.dask.workers(),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=cfg.dask.memory_limit,
            silence_logs=logging.ERROR,
            security=True,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_worker_callbacks(_local_worker)
        yield client


def dask_map(client: Any) -> Callable:
    from distributed import as_completed

    def map_fn(func: Callable, items: list) -> Iterator[Any]:
        if not items:
            return
        futures = client.map(func, items, pure=False)
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.cancel(futures)

    return map_fn


def warm_worker(langid: bool) -> None:
    """What every chunk task of a worker process needs first: the stages' modules, the character
    tables, the language-ID model (each loaded once per process)."""
    import data_prep.passes.chunks  # noqa: F401
    import data_prep.passes.pack  # noqa: F401
    from data_prep.steps.text import punct_or_symbol_chars, special_chars, unkept_table

    special_chars(), punct_or_symbol_chars(), unkept_table()
    if langid:
        from data_prep.steps.langid import load_model

        load_model()
