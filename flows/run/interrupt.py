"""Ctrl-C (and SIGTERM) end a command's whole job within seconds, in one line.

A terminal's Ctrl-C sends SIGINT to its foreground process group only. The processes a job
starts in sessions of their own — the DeepSpeed launcher and its ranks, the evaluation watcher,
the temporary Prefect server — never see it, and Python's KeyboardInterrupt in the driver lands
wherever its main thread happens to be (inside Prefect's engine, which reports it as a crash and
goes on waiting for the ranks). Measured before this module: the server died, the ranks trained on
to the last step, and the command failed 3.5 minutes later with four tracebacks.

So a job's driver (flows/run/lifeline.py) handles the signal itself: it says in one line where the
job stopped and that the same command resumes, SIGKILLs every process that carries its job token
(:func:`flows.run.lifeline.sweep`: ranks, launcher, watcher, Dask workers, server) and exits with
130 (128 + SIGINT, as shells report it). Nothing is half-written for a rerun to read: every file a
job publishes is written to a temporary name and renamed, its completion marker last (bloomline/io.py,
data_prep's markers, a checkpoint's ``latest``), which is what a kill at any moment relies on
already (bench/chaos.py).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, Optional

_where: list[Callable[[], str]] = []


def where(describe: Callable[[], str]) -> None:
    """What the line says about where the job stopped (a command sets it once it knows its folder):
    ``describe()`` returns a sentence such as ``"at step 12/30"``; it must be quick and may fail."""
    _where[:] = [describe]


def install() -> None:
    """Handle SIGINT and SIGTERM in this process (a job's driver, main thread) as the module says."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)


def _stop(signum: int, frame: Optional[object]) -> None:
    try:
        at = _where[0]() if _where else ""
    except Exception:  # noqa: BLE001 - the line is said without it
        at = ""
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    end_job(f"stopped by {name}{' ' + at if at else ''}; run the same command to resume", 128 + signum)


def end_job(line: str, status: int) -> None:
    """End this process's job as a signal does (the module docstring): every process of the job
    ended, ``line`` said last, this process gone with ``status``. Callable from any thread (a
    lease's renewal that found the folder taken, bloomline/lease.py)."""
    import threading

    from flows.run import lifeline

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while the job is being ended
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # This process's other threads (Prefect's, a local Dask scheduler's) go on logging while the
    # job is ended, and so would its multiprocessing helpers: their output goes nowhere from now
    # on, and the line goes out last, straight to the saved descriptor (the interrupted main thread
    # may hold rich's console lock, a live progress bar).
    tty = sys.stderr.isatty()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    err = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # A local Dask cluster's nannies run in this process and start a new worker for each one the
    # sweep kills (distributed/nanny.py _on_worker_exit), until the sweep's time limit: a nanny
    # that is closing restarts none.
    nanny = sys.modules.get("distributed.nanny")
    if nanny is not None:
        for n in list(nanny.Nanny._instances):
            n.status = nanny.Status.closing
    tok = lifeline.token()
    if tok is not None:
        commands = _command_lines(lifeline.carriers(tok))
        lifeline.sweep(tok, settle_s=0.5, limit_s=10.0)
        _release_shared_memory(commands)
    os.write(err, (("\n" if tty else "") + line + "\n").encode("utf-8", "replace"))
    os._exit(status)


def _command_lines(processes: list) -> list[list[str]]:
    out = []
    for p in processes:
        try:
            out.append(p.cmdline())
        except Exception:  # noqa: BLE001 - gone already
            continue
    return out


def _release_shared_memory(commands: list[list[str]]) -> None:
    """What the killed processes leave in /dev/shm: the CPU all-reduce buffers of a DeepSpeed launch
    killed before its ranks unlinked them (training/parallel/shm.py, found by the launcher's command
    line), and the POSIX semaphores of this process's multiprocessing objects (a local Dask
    cluster's queues), which its resource tracker, killed with the job, would have unlinked."""
    import gc

    from training.parallel.shm import release_job_shm

    for cmd in commands:
        try:
            release_job_shm(cmd)
        except (OSError, ValueError):
            pass
    try:
        import _multiprocessing
        from multiprocessing.synchronize import SemLock
    except ImportError:
        return
    for obj in gc.get_objects():
        if isinstance(obj, SemLock):
            name = getattr(obj._semlock, "name", None)
            if name:
                try:
                    _multiprocessing.sem_unlink(name)
                except OSError:
                    pass  # unlinked already (its creator's finalizer)
