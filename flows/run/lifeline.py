"""Every process a job starts ends with the job's driver, however the driver ends.

The driver is the process that runs a job's flows: the ``bloomline`` command, or a flow run that
``bloomline serve`` starts in a process of its own. At its start it takes a job token
(``BLOOMLINE_JOB=<pid>.<start time>.<random>``) into its environment, and every process it starts
inherits it: Prefect's temporary server, the Dask LocalCluster's workers, the DeepSpeed launcher
and each rank, the evaluation watcher, the checkpoint converter. A reaper process, started with
the token in a session of its own, holds the read end of a pipe whose write end only the driver
holds. When the driver ends — an exit, an exception, SIGKILL from the OOM killer — the kernel
closes that end, the reaper reads end-of-file and kills every process that carries the token,
scanning again until none is left (a dying launcher may have started one more), then exits.
A run that takes over the lock of a dead driver (flows/run/runlock.py) sweeps that driver's token the
same way before it starts, in case its reaper was killed too.

Why a reaper and not the parent-death signal (``prctl(PR_SET_PDEATHSIG)``): that signal reaches
only a direct child, fires when the *thread* that started the child ends rather than the process
(Prefect runs tasks in threads), and cannot be given to processes other programs start (Prefect's
server, Dask's workers, DeepSpeed's ranks). The environment is inherited through every fork and
exec, by programs we do not control too, and ``/proc/PID/environ`` shows it to the reaper.

Several nodes: the reaper ends the processes of its own node. Ranks on other nodes end because
their peers did: their next collective fails (a closed gloo connection at once; NCCL through
``NCCL_ASYNC_ERROR_HANDLING=1``, the recipes' default) and DeepSpeed's per-node launcher kills the
rest of its ranks when one exits. A node started with ``--no-ssh`` runs a driver of its own, whose
reaper ends its ranks when that ``bloomline train`` ends.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from typing import Optional

JOB_ENV = "BLOOMLINE_JOB"

_reaper: Optional[subprocess.Popen] = None  # this process's reaper, when it is a driver
_driver_pid: Optional[int] = None


def token() -> Optional[str]:
    """The job token of this process (None outside any job)."""
    return os.environ.get(JOB_ENV)


def driver_of(tok: str) -> tuple[int, float]:
    """(pid, start time) of the driver that made token ``tok``."""
    pid, start, _ = tok.split(".", 2)
    return int(pid), int(start) / 1000


def _started(pid: int) -> Optional[float]:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_alive(tok: str) -> bool:
    """Whether the driver of ``tok`` still runs (the same process, not a new one with its pid);
    False for a string that is no token (a lock file is read from a folder anyone may have written)."""
    try:
        pid, start = driver_of(tok)
    except (ValueError, AttributeError, TypeError):
        return False
    began = _started(pid)
    return began is not None and abs(began - start) < 0.01


def become_driver() -> str:
    """Make this process a job's driver: a new token in its environment (a token it inherited
    belongs to another job) and a reaper that ends the job's processes when this one ends.
    Idempotent within a process."""
    global _reaper, _driver_pid
    if _reaper is not None and _driver_pid == os.getpid():
        return os.environ[JOB_ENV]
    pid = os.getpid()
    tok = f"{pid}.{round((_started(pid) or time.time()) * 1000)}.{secrets.token_hex(4)}"
    env = {k: v for k, v in os.environ.items() if k != JOB_ENV}  # the reaper is not one of the job's processes
    # stdin: the pipe; the write end stays in this process only (pipes are not inherited, PEP 446)
    _reaper = subprocess.Popen(
        [sys.executable, "-m", "flows.run.lifeline", tok],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _driver_pid = pid
    os.environ[JOB_ENV] = tok
    return tok


def ensure_driver() -> str:
    """The job this process belongs to: the one whose token it carries while that driver lives
    (a flow nested in another, the evaluation watcher), else a new one with this process as
    its driver (a flow run started by ``bloomline serve``)."""
    tok = token()
    if tok is not None and (driver_of(tok)[0] == os.getpid() or is_alive(tok)):
        return tok
    return become_driver()


def carriers(tok: str) -> list:
    """The live processes of this user that carry token ``tok`` (psutil.Process), this one excluded."""
    import psutil

    me, uid = os.getpid(), os.getuid()
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if (
                p.pid == me
                or p.info["uids"] is None
                or p.info["uids"].real != uid
                or p.info["status"] == psutil.STATUS_ZOMBIE
            ):
                continue
            if p.environ().get(JOB_ENV) == tok:
                found.append(p)
        except (psutil.Error, OSError):
            continue  # gone, or not ours to read
    return found


def sweep(tok: str, settle_s: float = 1.0, limit_s: float = 30.0) -> list[int]:
    """SIGKILL every process that carries ``tok`` until none has been seen for ``settle_s``
    (one that was starting when the scan passed it is caught by the next); the pids killed."""
    import psutil

    killed: list[int] = []
    quiet_since = time.monotonic()
    deadline = quiet_since + limit_s
    while time.monotonic() < deadline:
        found = carriers(tok)
        for p in found:
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass
        if found:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settle_s:
            break
        time.sleep(0.1)
    return killed


def main(argv: list[str]) -> int:
    """The reaper: wait for end-of-file on stdin (the driver is gone), then sweep the token."""
    tok = argv[0]
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except OSError:
        pass
    sweep(tok)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
