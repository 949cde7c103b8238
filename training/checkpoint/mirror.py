"""A run's checkpoints mirrored to an object store (``checkpoint.mirror: s3://bucket/runs/x``).

The store holds the run folder's layout: ``URL/checkpoints/step_N/…``, ``URL/checkpoints/latest``,
and the run's logs that a resume continues (``metrics.jsonl``, ``mixture.jsonl``). One run writes
a mirror: the train flow holds its lease (``URL/.lock``, bloomline/lease.py) for the whole run, so
a second run given the same mirror (a copied run folder, two fresh nodes) is refused. A checkpoint is
uploaded as a local one is published (training/checkpoint/run_dir.py): its files, then its
``bloomline.json``, then ``latest``, each one upload (atomic on the store), so the mirror's
``latest`` always names a complete checkpoint. The newest ``checkpoint.keep`` are kept there
(:func:`prunable`: never ``latest``).

:class:`MirrorUploader` uploads each checkpoint the run publishes, in a thread of the train flow's
process while the ranks train on (the ranks never wait for the store). :func:`pull_latest` gives
an empty run folder (a fresh node) the mirror's latest checkpoint, so the run resumes from it;
:func:`fetch_checkpoint` copies one checkpoint at a URL for ``evaluate`` and ``export``.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from bloomline.errors import CheckpointError
from bloomline.io import write_bytes_atomic
from bloomline.names import confined
from bloomline.storage import errors_named, filesystem, is_url, join, local_path, url_key
from training.checkpoint.run_dir import META_FILE, RunDir, step_dir_name, step_of_dir_name

RUN_LOGS = ("metrics.jsonl", "mixture.jsonl")
"""The run's own files a resume continues, uploaded with each checkpoint."""
log = logging.getLogger("bloomline.mirror")


def upload_checkpoint(run: RunDir, step: int, url: str, keep: int) -> tuple[float, int]:
    """Upload checkpoint ``step`` of ``run`` to the mirror at ``url`` (files, bloomline.json,
    the run's logs, ``latest``), then remove the mirror's checkpoints beyond the newest ``keep``;
    returns (seconds, bytes)."""
    t0 = time.perf_counter()
    fs, root = filesystem(url)
    src = run.step_dir(step)
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.name != META_FILE)
    if not (src / META_FILE).is_file():
        raise CheckpointError(f"{src} has no {META_FILE}: not a complete checkpoint")
    sent = 0
    with errors_named(join(url, "checkpoints", step_dir_name(step))):
        for p in [*files, src / META_FILE]:
            fs.put_file(str(p), join(root, "checkpoints", step_dir_name(step), p.relative_to(src).as_posix()))
            sent += p.stat().st_size
        for name in RUN_LOGS:
            if (run.root / name).is_file():
                fs.put_file(str(run.root / name), join(root, name))
        fs.pipe_file(join(root, "checkpoints", "latest"), step_dir_name(step).encode())
        for old in prunable(mirrored_steps(url), step, keep):
            fs.rm(join(root, "checkpoints", step_dir_name(old)), recursive=True)
    return time.perf_counter() - t0, sent


def prunable(steps: list[int], latest: int, keep: int) -> list[int]:
    """The mirror's checkpoints to remove once ``latest`` is published: those past it (a killed or
    copied run's future, which this run redoes, as run_dir.py discards locally) and all but the
    newest ``keep`` up to it. ``latest`` itself never."""
    kept = [s for s in steps if s < latest][-(keep - 1) :] if keep > 1 else []
    return [s for s in steps if s != latest and s not in kept]


def mirrored_steps(url: str) -> list[int]:
    """The complete checkpoints (with their bloomline.json) on the mirror, ascending."""
    fs, root = filesystem(url)
    with errors_named(join(url, "checkpoints")):
        fs.invalidate_cache()
        try:
            names = fs.ls(join(root, "checkpoints"), detail=False)
        except FileNotFoundError:
            return []
        steps = []
        for n in names:
            name = n.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("step_") and fs.exists(join(root, "checkpoints", name, META_FILE)):
                steps.append(step_of_dir_name(name, url))
    return sorted(steps)


def _download_step(url: str, step: int, dest: Path) -> None:
    """Checkpoint ``step`` of the mirror into ``dest`` (``step_N``): its bloomline.json last."""
    fs, root = filesystem(url)
    base = join(root, "checkpoints", step_dir_name(step))
    with errors_named(join(url, "checkpoints", step_dir_name(step))):
        names = sorted(f[len(base) + 1 :] for f in fs.find(base))
        where = join(url, "checkpoints", step_dir_name(step))
        # the store's names, each confined to the step's folder before anything is written (bloomline/names.py)
        files = [(rel, confined(dest, rel, where)) for rel in [*(n for n in names if n != META_FILE), META_FILE]]
        for rel, path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(join(base, rel), str(path))


def pull_latest(run: RunDir, url: str) -> Optional[int]:
    """When ``run`` holds no checkpoint: the mirror's latest into it (with the run's logs), so the
    run resumes from it; the step pulled, or None (a run with checkpoints, or an empty mirror)."""
    if run.latest_step() is not None:
        return None
    fs, root = filesystem(url)
    with errors_named(join(url, "checkpoints", "latest")):
        try:
            name = fs.cat_file(join(root, "checkpoints", "latest")).decode().strip()
        except FileNotFoundError:
            return None
    step = step_of_dir_name(name, join(url, "checkpoints", "latest"))
    _download_step(url, step, run.step_dir(step))
    with errors_named(url):
        for name in RUN_LOGS:
            try:
                fs.get_file(join(root, name), str(run.root / name))
            except FileNotFoundError:
                pass
    write_bytes_atomic(run.latest_file, step_dir_name(step).encode())
    return step


def fetch_checkpoint(url: str, cache: Path) -> Path:
    """The checkpoint at ``url`` (``…/checkpoints/step_N``) copied under ``cache`` in a run folder's
    layout; its local step folder. A copy is reused while the mirror's objects are those it was
    made from (names, sizes, tags: one listing): a run saved again into the same mirror is
    fetched again."""
    base, _, name = url.rstrip("/").rpartition("/")
    run_url = base.rpartition("/")[0] if base.endswith("/checkpoints") else ""
    if not run_url:
        raise CheckpointError(f"{url}: a checkpoint URL ends in /checkpoints/step_N")
    step = step_of_dir_name(name, url)
    run = RunDir(cache / url_key(run_url))
    dest = run.step_dir(step)
    fs, path = filesystem(url)
    with errors_named(url):
        fs.invalidate_cache()
        found = fs.find(path, detail=True)
    objects = {
        k[len(path) + 1 :]: [v.get("size"), v.get("ETag") or v.get("etag") or v.get("mtime")] for k, v in found.items()
    }
    if META_FILE not in objects:
        raise CheckpointError(f"{join(url, META_FILE)} not found: not a complete checkpoint")
    record = dest.parent / f".{dest.name}.mirror.json"  # what the copy was made from
    if not (dest / META_FILE).is_file() or not record.is_file() or json.loads(record.read_text()) != objects:
        shutil.rmtree(dest, ignore_errors=True)
        _download_step(run_url, step, dest)
        write_bytes_atomic(record, json.dumps(objects, sort_keys=True, default=str).encode())
    return dest


def checkpoint_at(where: str | Path) -> Path:
    """A checkpoint folder to read: itself, or for a URL its copy in this machine's scratch space
    (:func:`fetch_checkpoint`)."""
    if not is_url(str(where)):
        return local_path(where)
    from bloomline.storage import scratch_dir

    return fetch_checkpoint(str(where), scratch_dir() / "bloomline-checkpoints")


class MirrorUploader:
    """Uploads each checkpoint ``run`` publishes to ``url`` from a daemon thread (polling
    ``latest``); :meth:`close` uploads the last one and waits. ``say`` hears each upload's time."""

    POLL_S = 1.0

    def __init__(self, run: RunDir, url: str, keep: int, say: Callable[[str], None] = log.info):
        self.run, self.url, self.keep, self.say = run, url, keep, say
        self.done: dict[int, tuple[float, int]] = {}  # step -> (seconds, bytes)
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bloomline-mirror", daemon=True)
        self._thread.start()

    def _once(self) -> None:
        try:
            step = self.run.latest_step()
        except CheckpointError:
            return  # latest moved while read: the next poll
        if step is None or step in self.done:
            return
        secs, sent = upload_checkpoint(self.run, step, self.url, self.keep)
        self.done[step] = (secs, sent)
        self.say(f"checkpoint step {step} mirrored to {self.url} ({sent / 2**20:.1f} MiB in {secs:.1f} s)")

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self._once()
            except Exception as e:  # the store unreachable: said, and tried again at the next poll
                if self.error is None:
                    self.say(f"warning: mirroring to {self.url} failed, retrying: {e}")
                self.error = e

    def stop(self) -> None:
        """Stop polling (what was uploaded stays)."""
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        """Stop polling; upload the last checkpoint if it is not yet (errors raised here)."""
        self._stop.set()
        self._thread.join()
        self._once()
