"""What every ``bloomline`` command shares: the console, the ``--debug`` option, the run of a
command's body (one-line errors, exit status 2), and the run of a flow command (its folder held,
its parameters handed with their secrets masked, Prefect's server ready).

Every user-facing failure is a one-line ``error: ...`` and exit status 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional, TypeVar

import typer
from rich.console import Console

from bloomline.errors import BloomlineError
from bloomline.storage import is_url
from bloomline.terminal import rich_escape
from flows.display.progress import ProgressBars
from flows.run.api_server import wait_ready
from flows.run.params import InProcess, flow_args

# Wide enough for the summary table when output goes to a file or CI log.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
"""The ``--debug`` option every command takes."""


def overrides(example: str) -> Any:
    """The repeatable ``-o key=value`` option, its help showing ``example``."""
    return typer.Option([], "-o", "--override", help=f"Override a value: -o {example} (repeatable).")


T = TypeVar("T")


def run_command(body: Callable[[], None], debug: bool, driver: bool = False, out: Path | None = None) -> None:
    """Run a command's ``body``: a BloomlineError ends it in one line with exit status 2, and so does
    a full disk (bloomline/disk.py) where it writes into ``out``; a driver's Ctrl-C ends its job
    (flows/run/interrupt.py)."""
    from bloomline.secrets import install_log_masking

    install_log_masking()
    if driver:  # every process this command starts ends with it (flows/run/lifeline.py), Ctrl-C too
        from flows.run import interrupt
        from flows.run.lifeline import become_driver

        become_driver()
        interrupt.install()
    if not debug:
        from flows.run import user_errors

        user_errors.install()
    try:
        try:
            body()
        except Exception as e:
            from bloomline.disk import disk_full_error, full_disk

            if out is not None and not is_url(str(out)) and not isinstance(e, BloomlineError) and full_disk(e, out):
                raise disk_full_error(e, out) from None
            raise
    except BloomlineError as e:
        if debug:
            raise
        from bloomline.secrets import mask_text

        console.print(f"[bold red]error:[/] {rich_escape(mask_text(str(e)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: rerun the same command to resume")
        raise typer.Exit(130) from None


_MANGLED_URL = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*:/(?!/)")


def local_out(out: Optional[Path], instead: str) -> None:
    """Refuse, in one line, a URL given for a local folder (``--out``): the option is a Path, and
    ``s3://b/x`` became the folder ``s3:/b/x``, which would be written here. ``instead``: what to
    do to keep it in a bucket."""
    if out is not None and _MANGLED_URL.match(str(out)):
        url = str(out).replace(":/", "://", 1)
        raise BloomlineError(f"--out {url}: this folder is written on this machine; {instead}")


def no_credentials(**options: Any) -> None:
    """Refuse, in one line, an option's URL that carries a user or password (``--data
    s3://KEY:SECRET@bucket/x``) before anything starts: no process of the job gets it in its command
    line (bloomline/storage.py ``check_no_credentials``)."""
    from bloomline.storage import check_no_credentials

    for name, value in options.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                check_no_credentials(str(v), "--" + name.replace("_", "-"))


@contextmanager
def owned(folder: Path, command: str, bars: bool = False) -> Iterator[ProgressBars | None]:
    """This command's job holds ``folder`` (flows/run/runlock.py): a second job on it is refused with
    one line naming the holder; a lock left by a dead job is taken over, with a warning. With
    ``bars``, yields the progress bars of the job's passes, stopped when it ends."""
    from flows.run.runlock import acquire

    with acquire(folder, command, say=lambda msg: console.print(f"[yellow]{rich_escape(msg)}[/]", highlight=False)):
        shown = ProgressBars(console) if bars else None
        try:
            yield shown
        finally:
            if shown is not None:
                shown.stop()


def run_flow(
    command: str,
    folder: Path,
    params: Any,
    call: Callable[[Any, InProcess], T],
    bars: bool = False,
    checked: Any = None,
) -> T:
    """A flow command's run, once its checks passed and Prefect's server was started early
    (flows/run/api_server.py): ``folder`` held (:func:`owned`), ``params`` handed with their secrets
    masked (flows/run/params.py) and with what the command ``checked`` of them, the server ready,
    then ``call(recorded_params, in_process)`` runs the flow."""
    with owned(folder, command, bars) as shown:
        recorded, in_process = flow_args(params, shown, checked=checked)
        wait_ready()
        return call(recorded, in_process)


def run_app(app: typer.Typer) -> None:
    """The process of one ``bloomline`` command: the app, then :func:`_exit_now`."""
    atexit.register(_exit_now)  # registered first, so run last: after every other exit handler
    try:
        app(prog_name="bloomline")
        _exit_code[0] = 0
    except SystemExit as e:
        _exit_code[0] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise


_exit_code = [1]  # what the process exits with: 1 unless the app returned or exited with a code


def _exit_now() -> None:
    """The end of the process, without the interpreter's teardown of every module a command has
    loaded (Prefect, Dask, pyarrow, torch): ~0.9 s at the end of each command, measured on
    ``prepare``, that a finished command has no use for. By the time this runs, Python has
    joined the non-daemon threads (Prefect drains its log and event queues there) and run every
    other exit handler (the temporary Prefect server stopped, logging flushed); the standard
    streams are flushed here. Files are closed where they are written (bloomline/io.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_code[0])
