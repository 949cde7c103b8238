"""A command with a Prefect server of its own, not the session's (tests/conftest.py ``prefect_server``)."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")


def own_server(env: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    """``env`` (else this process's environment) less the session server's variables, so the
    command starts its temporary server as a user's would; ``home``: its ``PREFECT_HOME``, where that
    server keeps its database."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k not in SHARED}
    if home is not None:
        out["PREFECT_HOME"] = str(home)
    return out
