"""Start a parallel evaluation's tp·pp ranks, as training's are started (on
this machine or on a hostfile's hosts: training/loop/launch.py), wait for rank 0's results, and
leave no rank behind: the job runs in a session of its own that is killed whole however it ends
(``run_job``), and every process carries the driver's job token (flows/run/lifeline.py), so a
killed driver's reaper ends them too."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from bloomline.config import to_dict
from bloomline.errors import BloomlineError
from training.config import EvalConfig
from training.config.launch import LaunchConfig
from training.loop.launch import EXIT_USER_ERROR, TIMED_OUT, check_hostfile, launcher, run_job

MAIN = Path(__file__).resolve().parent / "main.py"
CHECKED = "checked.json"
"""Beside ``--settings``: the checkpoint's record (bloomline.json, or a published folder's) as the
driver checked it, which the ranks evaluate with instead of reading and checking it again."""


class EvaluationFailed(BloomlineError):
    """A parallel evaluation that ended without results: a rank died, hung past the timeout, or refused."""


def error_line(log_file: Path, start: int = 0) -> Optional[str]:
    """The first ``error: ...`` a rank printed after byte ``start`` of the log (a user's problem),
    else the last line that names an exception or a kill."""
    if not log_file.is_file():
        return None
    with open(log_file, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    for line in lines:
        if "error: " in line and not line.lstrip().startswith("Traceback"):
            return line.split("error: ", 1)[1].strip()
    for line in reversed(lines):
        # the launcher, when a rank ends badly (training/loop/node_launch.py, DeepSpeed's on other
        # nodes): "[<the rank's command>] exits with return code = -9"; the command says nothing a user needs
        code = re.search(r"exits with return code = (-?\d+)", line)
        if code:
            n = int(code.group(1))
            if n < 0:
                return f"a rank was killed by {signal.Signals(-n).name if -n in signal.valid_signals() else -n}"
            return f"a rank exited with status {n}"
    for line in reversed(lines):
        if "Error" in line or "Killed" in line:
            return line.strip()[-300:]
    return None


def evaluate_on_ranks(
    ckpt_dir: Path,
    data_dir: Path,
    cfg: EvalConfig,
    run: str,
    meta: dict[str, Any],
    logs: Path,
    stamp: Optional[Path] = None,
    progress: Callable[[str], None] = lambda msg: None,
) -> dict[str, Any]:
    """eval/evaluate.py ``evaluate`` on ``cfg.parallel``'s ranks, logged in ``logs``: its Evaluation's
    fields, as rank 0 found them."""
    par = cfg.parallel
    world = par.world_size
    launch = LaunchConfig(hostfile=par.hostfile)
    check_hostfile(launch, world)
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"eval_step_{int(meta['step']):08d}.log"
    with tempfile.TemporaryDirectory(prefix="bloomline-eval-") as tmp:
        settings, result = Path(tmp) / "settings.json", Path(tmp) / "result.json"
        settings.write_text(json.dumps(to_dict(cfg)))
        (Path(tmp) / CHECKED).write_text(json.dumps(meta))  # the ranks evaluate what was checked here
        cmd = launcher(world, launch) + _rank_args(ckpt_dir, data_dir, settings, run, result, stamp)
        seen = [0]

        def poll() -> None:  # rank 0's progress lines, as they come
            if log_file.is_file():
                with open(log_file, errors="replace") as f:
                    f.seek(seen[0])
                    for line in f.readlines():
                        if line.startswith("progress: "):
                            progress(line[len("progress: ") :].rstrip())
                    seen[0] = f.tell()

        start = seen[0] = log_file.stat().st_size if log_file.exists() else 0
        progress(f"evaluating on {world} ranks (tp={par.tp} pp={par.pp}); log {log_file}")
        rc = run_job(cmd, log_file, dict(os.environ), timeout=par.timeout_s, poll=poll)
        poll()
        if rc == 0 and result.is_file():
            return _read_result(result)
    if rc == TIMED_OUT:
        raise EvaluationFailed(
            f"the evaluation on {world} ranks ran past parallel.timeout_s={par.timeout_s:g} s and was stopped (log {log_file})"
        )
    why = error_line(log_file, start)
    if rc == EXIT_USER_ERROR and why:  # a problem of the user's, said by the rank that met it
        raise EvaluationFailed(why)
    raise EvaluationFailed(f"the evaluation on {world} ranks failed: {why or f'exit status {rc}'} (log {log_file})")


def _rank_args(
    ckpt_dir: Path, data_dir: Path, settings: Path, run: str, result: Path, stamp: Optional[Path]
) -> list[str]:
    """eval/parallel/main.py and the arguments every rank runs it with (the checkpoint, data and
    stamp as absolute paths)."""
    args = [
        str(MAIN),
        "--checkpoint",
        str(ckpt_dir.resolve()),
        "--data",
        str(data_dir.resolve()),
        "--settings",
        str(settings),
        "--run",
        run,
        "--result",
        str(result),
    ]
    if stamp is not None:
        args += ["--stamp", str(Path(stamp).resolve())]
    return args


def _read_result(result: Path) -> dict[str, Any]:
    """Rank 0's Evaluation fields from its JSON (eval/parallel/main.py), timestamps parsed back."""
    got = json.loads(result.read_text())
    for r in got["rows"]:
        r["evaluated_at"] = dt.datetime.fromisoformat(r["evaluated_at"])
    for g in got["generations"]:
        g["evaluated_at"] = dt.datetime.fromisoformat(g["evaluated_at"])
    return got
