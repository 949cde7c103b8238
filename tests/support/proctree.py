"""Run a command and sample the memory of its whole process tree over time (psutil).

One ``ru_maxrss`` of the parent hides the Dask worker that grew, and a sum over the tree hides
which process did; this keeps each process's own peak RSS, sampled every ``interval`` seconds,
and names its role: the command itself (``driver``), a Dask worker, the temporary Prefect server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Sampled:
    seconds: float
    returncode: int
    stderr: str
    peaks: dict[int, float] = field(default_factory=dict)
    """Peak RSS in MiB of each process seen (by pid)."""
    roles: dict[int, str] = field(default_factory=dict)
    """driver, worker, prefect-server or other, by pid."""
    tree_peak: float = 0.0
    """Peak of the sum over the tree, MiB."""
    cpu: dict[int, float] = field(default_factory=dict)
    """CPU seconds (user + system) of each process, as last sampled."""
    cmdlines: dict[int, str] = field(default_factory=dict)
    """Each process's command line, as last sampled (for roles of one's own: a rank's --local_rank)."""
    timeline: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    """(time.time(), RSS in MiB by pid) of every sample, when asked for (``run_sampled(timeline=True)``)."""

    def peak(self, role: str) -> float:
        """The largest peak among the processes of ``role`` (0 when there were none)."""
        return max((v for pid, v in self.peaks.items() if self.roles[pid] == role), default=0.0)

    def cpu_of(self, role: str) -> float:
        """CPU seconds of all the processes of ``role`` together (to their last sample)."""
        return sum(v for pid, v in self.cpu.items() if self.roles[pid] == role)

    def count(self, role: str) -> int:
        return sum(r == role for r in self.roles.values())


def role_of(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "driver"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "other"
    if "prefect" in cmd and ("server" in cmd or "uvicorn" in cmd):
        return "prefect-server"
    if "resource_tracker" in cmd:
        return "other"
    # LocalCluster's workers are multiprocessing children (spawn or forkserver); `dask worker` on a cluster
    if "multiprocessing" in cmd or "dask" in cmd or "distributed" in cmd:
        return "worker"
    return "other"


def run_sampled(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, interval: float = 0.1, timeline: bool = False
) -> Sampled:
    """Run ``cmd`` in its own session, sampling every process of its tree until it exits; the
    session is killed afterwards (a temporary Prefect server may linger). ``timeline``: keep
    every sample too (to find the peak of each phase of a run)."""
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    out = Sampled(0.0, 0, "")
    root = psutil.Process(proc.pid)
    known: dict[int, psutil.Process] = {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = [root]
        total = 0.0
        now: dict[int, float] = {}
        for p in procs:
            try:
                rss = p.memory_info().rss / 2**20
                t = p.cpu_times()
                # read every time: a child seen between its fork and its exec shows its parent's
                line = " ".join(p.cmdline())
            except psutil.Error:
                continue
            out.cpu[p.pid] = t.user + t.system
            if line:  # (an exiting process's is empty)
                out.cmdlines[p.pid] = line
            if p.pid not in known:
                known[p.pid] = p
                out.roles[p.pid] = role_of(p, proc.pid)
            out.peaks[p.pid] = max(out.peaks.get(p.pid, 0.0), rss)
            now[p.pid] = rss
            total += rss
        if timeline:
            out.timeline.append((time.time(), now))
        out.tree_peak = max(out.tree_peak, total)
        time.sleep(interval)
    reader.join()
    out.seconds = time.time() - t0
    out.returncode = proc.returncode
    out.stderr = "".join(err)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return out
