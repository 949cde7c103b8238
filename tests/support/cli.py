"""The ``bloomline`` command run as a user runs it, in a process of its own from the repository:
:func:`cli` gives its result (stdout and stderr captured), on the session's Prefect server, or on a
temporary server of its own when given a ``PREFECT_HOME``; ``BLOOMLINE`` is the command line that
starts it. For the tests of the CLI (tests/flows/cli/test_cli.py) and of what runs through it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO
from tests.support.prefect import own_server

BLOOMLINE = [sys.executable, "-m", "flows.cli.app"]


def cli(*args, timeout=600, **kw):
    """The command's result; ``env``: variables to add. Given a ``PREFECT_HOME`` of its own, the
    command keeps its runs there, on the temporary server it starts, not the session's."""
    extra = kw.pop("env", {})
    env = {**(own_server() if "PREFECT_HOME" in extra else os.environ), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run(
        [*BLOOMLINE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**env, **{k: str(v) for k, v in extra.items()}},
        **kw,
    )
