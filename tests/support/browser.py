"""Pages opened as a reader opens them: headless Chromium (Debian's ``chromium``, installed by
.ci/run) on a ``file://`` page, with no network. :func:`open_page` gives the DOM after the page's
scripts ran and the browser's console; :func:`planted` makes script-running markup of every kind a
crawl carries, to put in what a page shows. For the tests of the dashboard and the comparison page
(tests/eval/pages/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "the browser test needs Debian's chromium (apt-get install -y chromium; .ci/run installs it)"
    return exe


def planted(tag: str) -> list[str]:
    """Script-running markup of every kind a crawl carries; each, if it ran, would rename the page
    ``pwned-<tag>-<kind>``."""
    js = lambda name: f"document.title='pwned-{tag}-{name}'"  # noqa: E731
    return [
        f'<img src=x onerror="{js("img")}">',
        f"<script>{js('script')}</script>",
        f'<svg onload="{js("svg")}">',
        f'</td></tr></table><img src=x onerror="{js("cell")}"> | x |',
        f"[link](javascript:{js('md')})",
    ]


def open_page(page: Path) -> tuple[str, str]:
    """(DOM after the page's scripts ran, browser console) of ``page`` in headless Chromium."""
    base = [
        chromium(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=15000",
        "--enable-logging=stderr",
        "--v=0",
    ]
    res = subprocess.run([*base, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    return res.stdout, "\n".join(l for l in res.stderr.splitlines() if "CONSOLE" in l)
