"""What ``bloomline serve`` keeps on disk, and how a command proves a server is the user's own.

The folder is ``$BLOOMLINE_HOME/serve`` (``~/.bloomline/serve`` by default), mode 0700, and holds
two files, each mode 0600 and this user's:

- ``auth``: the server's auth string (Prefect's ``PREFECT_SERVER_API_AUTH_STRING``; a client
  sends it as ``PREFECT_API_AUTH_STRING``), made by the first ``bloomline serve`` that was given
  none and kept, so the user's later commands, ``prefect`` CLI
  (``PREFECT_API_AUTH_STRING="$(cat ~/.bloomline/serve/auth)"``) and browser (the UI asks for it)
  reach the server;
- ``server.json``: where a running ``bloomline serve``'s server answers (``{"url", "pid"}``),
  removed when it stops; what a command reads to report to that server
  (flows/run/api_server.py).

A file that is not this user's, is a symbolic link, or that others may read or write is not
used. A server on this machine counts as the user's own (:func:`owned_server`) only when every
socket listening on its port belongs to this user (Linux's ``/proc/net/tcp``: another user's
squatter on the port fails here, before it is sent anything) and it refuses a request without
the auth string and answers one with it. This module imports nothing heavy: commands read it
before Prefect is imported.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import stat
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from bloomline.errors import BloomlineError
from bloomline.io import atomic_path

HOME_ENV = "BLOOMLINE_HOME"
GIVEN = ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING")
"""Where a user gives serve its auth string (the server's setting, or the client's)."""
CHECK_PATH = "/admin/version"  # an API path behind Prefect's auth (only /health and /ready are not)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""The host names of this machine's loopback."""


def folder() -> Path:
    return (Path(os.environ.get(HOME_ENV) or Path.home() / ".bloomline") / "serve").absolute()


def auth_file() -> Path:
    return folder() / "auth"


def marker_file() -> Path:
    return folder() / "server.json"


def read_private(path: Path) -> str | None:
    """The text of ``path`` when it is a regular file of this user's that no other user may read
    or write (mode 0600 or stricter; a symbolic link is not followed), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        return f.read()


def write_private(path: Path, text: str) -> None:
    """``path`` holds ``text``, mode 0600, written atomically; its folder is made mode 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)


def auth_string() -> tuple[str, str]:
    """(the auth string ``bloomline serve`` requires, where it came from): the one the user gave
    (``PREFECT_SERVER_API_AUTH_STRING``, else ``PREFECT_API_AUTH_STRING``), else the one kept in
    :func:`auth_file`, else a new one (``secrets.token_urlsafe``, 256 bits) kept there."""
    for name in GIVEN:
        if os.environ.get(name):
            return os.environ[name], name
    path = auth_file()
    if path.exists() or path.is_symlink():
        kept = read_private(path)
        if not kept or not kept.strip():
            raise BloomlineError(
                f"{path} is not a private file of this user's (mode 0600, no link): "
                "remove it and bloomline serve makes a new one"
            )
        return kept.strip(), str(path)
    made = secrets.token_urlsafe(32)
    write_private(path, made + "\n")
    return made, str(path)


def kept_auth_string() -> str | None:
    """The auth string a command sends to a server it adopts: ``PREFECT_API_AUTH_STRING``, else
    the one :func:`auth_file` keeps (None when neither)."""
    given = os.environ.get("PREFECT_API_AUTH_STRING")
    if given:
        return given
    kept = read_private(auth_file())
    return kept.strip() if kept and kept.strip() else None


def write_marker(url: str) -> None:
    write_private(marker_file(), json.dumps({"url": url, "pid": os.getpid()}) + "\n")


def remove_marker() -> None:
    """Remove :func:`marker_file` if this process wrote it (another serve's is left alone)."""
    text = read_private(marker_file())
    try:
        if text is not None and json.loads(text).get("pid") == os.getpid():
            marker_file().unlink()
    except (ValueError, AttributeError, OSError):
        pass


def marked_url() -> str | None:
    """The URL :func:`marker_file` names, if it is a private file of this user's naming one."""
    text = read_private(marker_file())
    try:
        url = json.loads(text)["url"] if text else None
    except (ValueError, KeyError, TypeError):
        return None
    return url if isinstance(url, str) and url.startswith("http://") else None


def status(api_url: str, auth: str | None, timeout: float = 2.0) -> int | None:
    """The HTTP status of ``GET {api_url}/admin/version`` sent with ``auth`` as Prefect's client
    sends it (Basic, base64 of the string), or without credentials; None when nothing answers."""
    req = urllib.request.Request(f"{api_url.rstrip('/')}{CHECK_PATH}")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def listener_uids(port: int) -> list[int]:
    """The owners (uids) of the sockets listening on TCP ``port`` on this host, any address, IPv4
    and IPv6 (Linux ``/proc/net/tcp*``; empty where there is none, or no such file)."""
    uids = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            # local_address is HEXADDR:HEXPORT, st 0A is LISTEN, the 8th field the uid
            if len(f) > 7 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                uids.append(int(f[7]))
    return uids


def listeners_ours(port: int) -> bool:
    """Whether something listens on TCP ``port`` on this host and every such socket is this
    user's (False where none can be seen: nothing proves the port is ours)."""
    uids = listener_uids(port)
    return bool(uids) and all(uid == os.getuid() for uid in uids)


def accepts(host: str, port: int) -> bool:
    """Whether something accepts a TCP connection at ``host``:``port`` (nothing is sent)."""
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True


def owned_server(api_url: str, auth: str) -> bool:
    """Whether the server at ``api_url`` is provably this user's own: on this machine's loopback,
    every listener on its port this user's (checked before anything is sent to it, the auth
    string least of all), and it refuses a request without ``auth`` (401) and answers one with it."""
    u = urllib.parse.urlsplit(api_url)
    # a connection first, which sends nothing: reading the kernel's socket tables costs ~20 ms, and
    # a starting server polled 20 times a second (flows/run/api_server.py) lost 40% of a core to it
    if u.hostname not in LOOPBACK or u.port is None or not accepts(u.hostname, u.port) or not listeners_ours(u.port):
        return False
    return status(api_url, None, 0.5) == 401 and status(api_url, auth, 2.0) == 200
