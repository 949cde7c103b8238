"""Kill the main job's driver anywhere, rerun it, and compare the result with an uninterrupted run:
the harness (``python -m bench.chaos`` runs it with a kill at every target and prints the tables;
tests/flows/stages/test_pipeline.py runs a few kills of it on the demo recipe in CI).

As an operator meets it: ``bloomline pipeline`` runs as a process of its own; at a moment drawn at
random (seeded) its driver — that process only, as the OOM killer picks one — gets
SIGKILL. The harness then checks that no process of the killed job is alive 20 s later (its
descendants as they were just before the kill, and every process carrying its job token,
flows/run/lifeline.py) and that it left no DeepSpeed buffer in /dev/shm, and reruns the same command
on the same folder, until every kill of the plan is spent and a last rerun finishes. Then the
final shards, the losses of every step, the evaluation rows and the exported weights are compared
with an uninterrupted run of the same recipe, byte for byte (evaluation rows less the time they
were made at, and checkpoint paths relative to their run folder).

The moments: one kill per target drawn (of ``TARGETS``, in pipeline order), each
``U(0, 1)`` × the length of that target's window in the uninterrupted run after the target is
first seen in the killed run's folder (polled every 20 ms). A window that closes sooner means the
kill lands in whatever comes next; the table reports the activity actually hit. A target a rerun
never reaches (its stage already done) is reported as missed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from data_prep.pipeline import PASSES
from tests.support import REPO

TARGETS = (
    *(f"prepare:{p.name}" for p in PASSES if p.unit),  # the passes with work to land in
    "train:steps",
    "train:checkpoint",
    "evaluation",
    "export",
)
"""Where a kill may be aimed, in pipeline order: data preparation's passes (data_prep/pipeline.py ``PASSES``),
training between and during checkpoint writes, an evaluation running (the watcher's, or the
pipeline's evaluation stage), the export (with the dashboard before it)."""
POLL_S = 0.02
GRACE_S = 20.0  # the killed job's processes must be gone by then
SHM = Path("/dev/shm")
STAGE_MARKER = ".stage.json"  # flows/stages/reuse.py MARKER


def _dirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []


def _chunks(plan: Path, cache: dict[Path, int]) -> int:
    if plan not in cache:
        cache[plan] = len(json.loads(plan.read_text())["chunks"])
    return cache[plan]


def _steps(recipe: Path, cache: dict[Path, int]) -> int:
    if recipe not in cache and recipe.is_file():
        cache[recipe] = json.loads(recipe.read_text())["train"]["steps"]
    return cache.get(recipe, 0)


def _last_step(metrics: Path) -> int:
    """The step of the last whole line of ``metrics.jsonl`` (0 before the first; -1 without the file)."""
    try:
        data = metrics.read_bytes()
    except FileNotFoundError:
        return -1
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def _prepare_now(work: Path, cache: dict[Path, int]) -> str:
    """The pass a prepare folder's markers (``PASSES``) show running: the first whose marker is
    missing, the chunks pass until every chunk has one; from pack on, the rest of the run."""
    for one in PASSES:
        if one.name == "chunks":
            if len(list((work / "chunks").glob("c*.json"))) < _chunks(work / "plan.json", cache):
                return "prepare:chunks"
        elif "<" in one.marker or one.marker.startswith("DIR/"):
            return f"prepare:{one.name}"
        elif not (work / one.marker).is_file():
            return f"prepare:{one.name}"
    return "prepare:manifest"


def commit_seed(repo: Path) -> int:
    """The seed of a CI run's kills: ``BLOOMLINE_CHAOS_SEED`` when set, else drawn from the commit
    under test (``git rev-parse HEAD``), so a failure replays from the commit alone; 0 outside a
    git checkout."""
    given = os.environ.get("BLOOMLINE_CHAOS_SEED")
    if given:
        return int(given)
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return 0
    return int(sha[:8], 16)


def activity(run: Path, cache: Optional[dict[Path, int]] = None) -> frozenset[str]:
    """What the pipeline's folder ``run`` shows going on now (a subset of TARGETS, plus
    ``prepare:plan`` and ``starting``)."""
    cache = {} if cache is None else cache
    act: set[str] = set()
    try:
        for d in _dirs(run / "prepare"):
            work = d / ".work"
            if (d / "manifest.json").is_file() and not work.exists():
                continue
            act.add(_prepare_now(work, cache))
        trained = []
        for d in _dirs(run / "train"):
            if (d / STAGE_MARKER).is_file():
                trained.append(d)
                continue
            if any(not (p / "bloomline.json").is_file() for p in (d / "checkpoints").glob("step_*")):
                act.add("train:checkpoint")
            if 0 <= _last_step(d / "metrics.jsonl") < _steps(d / "recipe.json", cache):
                act.add("train:steps")  # (after the last step, the flow waits for the evaluations: not this)
            hold = d / "checkpoints" / "hold.json"
            if hold.is_file() and json.loads(hold.read_text() or "{}").get("busy") is not None:
                act.add("evaluation")
        if trained:
            evaluated = any((d / STAGE_MARKER).is_file() for d in _dirs(run / "evaluate"))
            if not evaluated:
                act.add("evaluation")
            elif not any((d / STAGE_MARKER).is_file() for d in _dirs(run / "export")):
                act.add("export")
    except (OSError, ValueError):
        pass  # a file replaced while read: the next poll sees it whole
    return frozenset(act or {"starting"})


class Watch:
    """Polls :func:`activity` in a thread; ``timeline`` holds (seconds since start, activity) at each change."""

    def __init__(self, run: Path):
        self.run, self.t0 = run, time.monotonic()
        self.timeline: list[tuple[float, frozenset[str]]] = []
        self._stop = threading.Event()
        self._cache: dict[Path, int] = {}
        self.now: frozenset[str] = frozenset()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            a = activity(self.run, self._cache)
            if a != self.now:
                self.now = a
                self.timeline.append((time.monotonic() - self.t0, a))
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def windows(self, end: float) -> dict[str, float]:
        """The mean length of each activity's windows (seconds), the run ending at ``end``."""
        spans: dict[str, list[float]] = {}
        opened: dict[str, float] = {}
        for t, a in [*self.timeline, (end, frozenset())]:
            for x in list(opened):
                if x not in a:
                    spans.setdefault(x, []).append(t - opened.pop(x))
            for x in a:
                opened.setdefault(x, t)
        return {k: sum(v) / len(v) for k, v in spans.items()}


def launch(out: Path, config: Path, overrides: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("BLOOMLINE_JOB", None)  # the command is a job of its own
    args = [a for o in overrides for a in ("-o", o)]
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli.app", "pipeline", "--out", str(out), "--config", str(config), *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )


def job_of(driver: int) -> list[psutil.Process]:
    """The live processes carrying a job token made by process ``driver`` (flows/run/lifeline.py)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("BLOOMLINE_JOB", "").startswith(
                f"{driver}."
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def shm_buffers() -> set[str]:
    return {p.name for p in SHM.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*")} if SHM.is_dir() else set()


@dataclass
class Kill:
    target: str
    hit: str = "missed"  # the activity at the kill, or "missed" (the run never reached the target)
    after_s: float = 0.0  # seconds into that run
    delay_s: float = 0.0  # drawn: after the target was first seen
    leftovers: list[str] = field(default_factory=list)  # processes of the killed job alive GRACE_S later
    gone_s: float = 0.0  # how long its processes took to end
    shm: list[str] = field(default_factory=list)  # buffers it left in /dev/shm


def uninterrupted(out: Path, config: Path, overrides: list[str]) -> tuple[float, dict[str, float]]:
    """Run the pipeline into ``out`` uninterrupted; (wall seconds, mean window of each activity)."""
    watch = Watch(out)
    t0 = time.monotonic()
    p = launch(out, config, overrides, out.parent / f"{out.name}.log")
    rc = p.wait()
    seconds = time.monotonic() - t0
    watch.stop()
    if rc != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {rc}); see {out.parent / (out.name + '.log')}")
    return seconds, watch.windows(watch.timeline[-1][0] if watch.timeline else seconds)


def draw(rng: random.Random, kills: int, windows: dict[str, float]) -> list[tuple[str, float]]:
    """``kills`` targets in pipeline order (each at most once while there are enough), each with
    a delay drawn within its window in the uninterrupted run."""
    targets = sorted(rng.sample(TARGETS, k=min(kills, len(TARGETS))), key=TARGETS.index)
    targets += sorted(rng.choices(TARGETS, k=max(0, kills - len(TARGETS))), key=TARGETS.index)
    targets.sort(key=TARGETS.index)
    return [(t, rng.uniform(0, windows.get(t, 1.0))) for t in targets]


def begun(log: Path, start: int) -> bool:
    """Whether the run logging into ``log`` from byte ``start`` has begun its work (its first flow run)."""
    with open(log, "rb") as f:
        f.seek(start)
        return b"Beginning flow run" in f.read()


def saving(run: Path) -> bool:
    """Whether a checkpoint of ``run`` is being written (a step folder without its bloomline.json):
    a window of tens of milliseconds for bloom-tiny, watched apart from :class:`Watch`."""
    for d in _dirs(run / "train"):
        try:
            if any(
                not (p / "bloomline.json").is_file()
                for p in (d / "checkpoints").iterdir()
                if p.name.startswith("step_")
            ):
                return True
        except OSError:
            continue
    return False


def passed(target: str, now: frozenset[str]) -> bool:
    """Whether a run showing ``now`` can no longer reach ``target``: data preparation's stages come
    one after the other, and nothing but the export comes after it."""
    if "export" in now:
        return target != "export"
    if target.startswith("prepare:"):
        return any(TARGETS.index(a) > TARGETS.index(target) for a in now if a in TARGETS)
    return False


def kill_and_check(driver: subprocess.Popen, shm_before: set[str]) -> tuple[list[str], float, list[str]]:
    """SIGKILL ``driver``; (processes of its job alive GRACE_S later, seconds until all were gone, new /dev/shm buffers)."""
    try:
        before = psutil.Process(driver.pid).children(recursive=True)
    except psutil.Error:
        before = []
    before += job_of(driver.pid)
    t0 = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    while time.monotonic() - t0 < GRACE_S:
        if not any(alive(p) for p in before) and not job_of(driver.pid):
            break
        time.sleep(0.1)
    gone_s = time.monotonic() - t0
    left = {p.pid: p for p in [*before, *job_of(driver.pid)] if alive(p)}
    names = []
    for p in left.values():
        try:
            names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return names, gone_s, sorted(shm_buffers() - shm_before)


def chaos(
    out: Path,
    config: Path,
    overrides: list[str],
    plan: list[tuple[str, float]],
    say: Callable[[str], None] = print,
    limit_runs: int = 30,
) -> list[Kill]:
    """Run the pipeline into ``out``, killing its driver as ``plan`` says, rerunning until it finishes."""
    kills = [Kill(t, delay_s=d) for t, d in plan]
    todo = list(kills)
    shm_before = shm_buffers()
    log = out.parent / f"{out.name}.log"
    for _ in range(limit_runs):
        watch = Watch(out)
        t0 = time.monotonic()
        start = log.stat().st_size if log.exists() else 0
        driver = launch(out, config, overrides, log)
        while todo and driver.poll() is None:
            k = todo[0]
            if not begun(log, start):  # the folder shows where the last run stopped, not what this one does
                time.sleep(POLL_S)
                continue
            if passed(k.target, watch.now):
                say(f"missed: {k.target} (the run went past it unseen)")
                todo.pop(0)
                continue
            if k.target == "train:checkpoint" and "train:steps" in watch.now:
                if not saving(out):
                    time.sleep(0.001)
                    continue
            elif k.target not in watch.now:
                time.sleep(POLL_S)
                continue
            seen = time.monotonic()
            while time.monotonic() < seen + k.delay_s and driver.poll() is None:
                time.sleep(0.005)
            if driver.poll() is not None:
                say(
                    f"missed: {k.target} (the run ended {time.monotonic() - seen:.2f} s after it was seen, before the "
                    f"drawn +{k.delay_s:.2f} s)"
                )
                todo.pop(0)
                break
            k.hit = "+".join(sorted(activity(out) | ({"train:checkpoint"} if saving(out) else set())))
            k.after_s = time.monotonic() - t0
            k.leftovers, k.gone_s, k.shm = kill_and_check(driver, shm_before)
            todo.pop(0)
            say(
                f"kill {kills.index(k) + 1}/{len(kills)}: aimed at {k.target} (+{k.delay_s:.2f} s), hit {k.hit} "
                f"{k.after_s:.1f} s into the run; its processes gone in {k.gone_s:.1f} s, left alive: {len(k.leftovers)}, "
                f"/dev/shm: {len(k.shm)}"
            )
            break
        rc = driver.wait()
        watch.stop()
        if driver.returncode == -signal.SIGKILL:
            continue
        if rc != 0:
            raise RuntimeError(f"a rerun failed (exit {rc}); see {log}")
        # finished: a target it never reached is missed; no rerun is left to reach it
        for k in todo:  # (the one it ended during is reported above)
            say(f"missed: {k.target} (the run finished without reaching it)")
        return kills
    raise RuntimeError(f"no finished run after {limit_runs} runs; see {log}")


def _stage_dirs(ref: Path, run: Path, stage: str) -> tuple[Path, Path]:
    """The complete output of ``stage`` in ``run`` (it has one) and the same key's in ``ref``."""
    found = [d for d in _dirs(run / stage) if (d / STAGE_MARKER).is_file()]
    if len(found) != 1:
        raise RuntimeError(f"{run / stage}: {len(found)} complete outputs, expected 1")
    return ref / stage / found[0].name, found[0]


def _files(root: Path, skip: tuple[str, ...]) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def differences(ref: Path, run: Path) -> dict[str, list[str]]:
    """What differs between two finished pipeline folders of one recipe (``ref`` may hold outputs of
    other recipes too; those of ``run``'s keys are compared): the prepared data (every
    file, less the lock and the per-run timing), the losses of each step, the evaluation rows and
    generations, the exported model."""
    from eval.results.table import read_generations, read_results
    from training.loop.metrics_log import read_metrics

    out: dict[str, list[str]] = {}
    skip = (".lock", STAGE_MARKER, "run_stats.json")
    pa_, pb = _stage_dirs(ref, run, "prepare")
    a, b = _files(pa_, skip), _files(pb, skip)
    out["shards"] = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    ta, tb = _stage_dirs(ref, run, "train")
    fields = ("loss", "grad_norm", "lr", "global_batch_tokens", "bucket", "skipped")
    ma = {r["step"]: tuple(r.get(f) for f in fields) for r in read_metrics(ta / "metrics.jsonl")[0]}
    mb = {r["step"]: tuple(r.get(f) for f in fields) for r in read_metrics(tb / "metrics.jsonl")[0]}
    out["losses"] = [f"step {s}" for s in sorted(ma.keys() | mb.keys()) if ma.get(s) != mb.get(s)]

    def rows(train: Path, table: Any) -> list[tuple]:
        keep = [c for c in table.column_names if c != "evaluated_at"]
        got = []
        for r in table.select(keep).to_pylist():
            if "checkpoint" in r:
                r["checkpoint"] = os.path.relpath(r["checkpoint"], train)
            got.append(tuple(sorted((k, repr(v)) for k, v in r.items())))
        return sorted(got)

    ea, eb = rows(ta, read_results(ta)), rows(tb, read_results(tb))
    out["evaluation"] = [f"{len(set(ea) ^ set(eb))} rows differ of {len(ea)} and {len(eb)}"] if ea != eb else []
    ga, gb = rows(ta, read_generations(ta)), rows(tb, read_generations(tb))
    out["generations"] = [f"{len(set(ga) ^ set(gb))} rows differ of {len(ga)} and {len(gb)}"] if ga != gb else []
    # the export's key hashes its checkpoint's files, which name their run folder: found by what it exported
    xa, xb = (_files(_export_of(root, train), (STAGE_MARKER, EXPORT_META)) for root, train in ((ref, ta), (run, tb)))
    out["export"] = sorted(k for k in xa.keys() | xb.keys() if xa.get(k) != xb.get(k))
    meta = [json.loads((_export_of(root, train) / EXPORT_META).read_text()) for root, train in ((ref, ta), (run, tb))]
    for m, root in zip(meta, (ref, run)):
        m["checkpoint"], m["data_dir"] = os.path.relpath(m["checkpoint"], root), os.path.relpath(m["data_dir"], root)
    if meta[0] != meta[1]:
        out["export"].append(EXPORT_META)
    return out


EXPORT_META = "bloomline_export.json"  # training/hf/to_hf.py: what was exported, from where


def _export_of(run: Path, train: Path) -> Path:
    """The complete export in ``run`` of the final checkpoint of training run ``train``."""
    for d in _dirs(run / "export"):
        if (d / STAGE_MARKER).is_file() and Path(
            json.loads((d / EXPORT_META).read_text())["checkpoint"]
        ).parent.parent == train:
            return d
    raise RuntimeError(f"{run / 'export'}: no export of {train}")
