"""Another job holding a folder's lock: a process that takes it (flows/run/runlock.py ``acquire``) as a
job's driver, says ``held``, and keeps it until killed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO

_CODE = """
import sys, time
from bloomline import lease
from flows.run import lifeline
from flows.run.runlock import acquire
if sys.argv[3]:
    lease.LEASE_SECONDS = float(sys.argv[3])
lifeline.become_driver()
acquire(sys.argv[1], sys.argv[2])
print("held", flush=True)
time.sleep(300)
"""


def start_holder(url: str, command: str = "test holder", lease_seconds: float | None = None) -> subprocess.Popen:
    """The holder of ``url``'s lock, once it holds it (its stdout and stderr are pipes)."""
    from flows.run import lifeline

    env = {k: v for k, v in os.environ.items() if k != lifeline.JOB_ENV}  # a job of its own
    p = subprocess.Popen(
        [sys.executable, "-c", _CODE, url, command, "" if lease_seconds is None else str(lease_seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    line = p.stdout.readline().strip()
    if line != "held":
        p.kill()
        raise AssertionError(f"the holder did not take {url}: {p.communicate()[1][-2000:]}")
    return p
