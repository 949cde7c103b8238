"""Where the bench scripts run from, and how they start ``bloomline``.

Every script here runs as a module from the repository root (``python -m bench.NAME``), so the
repository's packages and tests/support import as they are. A script starts the CLI as this
interpreter running ``flows.cli.app`` (the ``bloomline`` script may be another environment's), from
``REPO`` or from another checkout of it (``repo``: a before/after comparison).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository root."""
SHARED = REPO.parent / "shared" / "corpus"
"""The corpus most benches prepare or grow from (``../shared/corpus``, beside the repository)."""


def cli_command(*args: object) -> list[str]:
    """``bloomline ARGS`` as a command line."""
    return [sys.executable, "-m", "flows.cli.app", *map(str, args)]


def repo_env(repo: Path = REPO, **extra: str) -> dict[str, str]:
    """This process's environment for a command running ``repo``'s code: ``repo`` first on
    ``PYTHONPATH`` (so the processes the command starts import it too), Prefect's analytics off,
    and ``extra`` (``DS_ACCELERATOR="cpu"``)."""
    path = os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **extra}


def cli(*args: object, log: Path | None = None, repo: Path = REPO, **env: str) -> str:
    """Run ``bloomline ARGS`` from ``repo`` to its end; returns what it printed (stdout and stderr
    together). The output goes to ``log`` (rewritten) or a temporary file: a file, not a pipe, so
    that a process the command leaves behind cannot hold this call open. A failure ends the bench
    (SystemExit naming the command, its exit status, and the log or the output's tail). ``env``:
    extra variables (:func:`repo_env`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = log or Path(tmp) / "cli.log"
        with open(path, "w") as f:
            rc = subprocess.run(
                cli_command(*args), cwd=repo, env=repo_env(repo, **env), stdout=f, stderr=subprocess.STDOUT
            ).returncode
        out = path.read_text(encoding="utf-8", errors="replace")
    if rc:
        where = f"; see {log}" if log else f":\n{out[-3000:]}"
        raise SystemExit(f"bloomline {args[0]} failed (exit {rc}){where}")
    return out
