"""Whether a checkpoint's files are the ones its ranks wrote, checked before any rank reads them.

Each checkpoint's ``bloomline.json`` records every file of its folder with its size and sha256
(``files``, training/CHECKPOINT.md): the ranks hash them when they save, each a share of the files
(:func:`file_records`). Before ranks resume from a checkpoint, :func:`damage` compares the folder
with that record and loads every file safely (training/checkpoint/safe_load.py: no file may name
code, and DeepSpeed's own loader would run it). A damaged file — cut short by a full disk, a
killed copy, bit rot — is then found in one process before any rank starts, instead of failing
every rank of every restart inside ``torch.load`` (``PytorchStreamReader failed reading zip
archive``), and the run falls back to the newest intact checkpoint (:func:`newest_intact`).
Cost: the hashing reads each checkpoint once more as it is saved (a share per rank) and the
resumed one once before the ranks start (8 threads).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from bloomline.errors import CheckpointError
from bloomline.io import sha256_file
from training.checkpoint.meta import read_meta
from training.checkpoint.run_dir import META_FILE, RunDir, step_dir_name
from training.checkpoint.safe_load import RefusedCheckpoint, check_folder


def checkpoint_files(step_dir: Path) -> list[str]:
    """The names of the files a checkpoint's ranks wrote into ``step_dir`` (not bloomline.json,
    which records them), sorted: every rank lists the same, and hashes its share."""
    return sorted(p.name for p in step_dir.iterdir() if p.is_file() and p.name != META_FILE)


def file_records(step_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of these files of ``step_dir`` (hashed on threads:
    hashlib releases the GIL, so a rank's share of a large checkpoint reads at disk speed)."""

    def record(name: str) -> tuple[str, dict[str, Any]]:
        f = step_dir / name
        return name, {"bytes": f.stat().st_size, "sha256": sha256_file(f)}

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(record, names))


def damage(step_dir: Path, meta: Optional[dict[str, Any]] = None) -> Optional[str]:
    """What is wrong with ``step_dir``'s files, in words naming the file, or None when they are as
    recorded and load. Sizes first (cheap), then the sha256s, on threads. A checkpoint written
    before the record existed (contract versions 1-3) is checked for loading only. A file that
    names code raises RefusedCheckpoint: that is no damage to fall back from, and the same
    refusal would meet it again."""
    try:
        meta = read_meta(step_dir) if meta is None else meta
        files = sorted((meta.get("files") or {}).items())
        for name, want in files:
            f = step_dir / name
            if not f.is_file():
                return f"{f} is missing"
            if f.stat().st_size != want["bytes"]:
                return f"{f} is damaged: {f.stat().st_size} bytes, {want['bytes']} when it was written"
        with ThreadPoolExecutor(max_workers=8) as pool:
            sums = list(pool.map(lambda item: sha256_file(step_dir / item[0]), files))
        for (name, want), got in zip(files, sums):
            if got != want["sha256"]:
                return f"{step_dir / name} is damaged: its sha256 differs from the one recorded when it was written"
        check_folder(step_dir)  # every .pt file, universal/ too, loads as data
    except RefusedCheckpoint:
        raise
    except CheckpointError as e:
        return str(e)
    return None


def newest_intact(run: RunDir, say: Callable[[str], None]) -> Optional[int]:
    """Make ``latest`` stand for the newest intact checkpoint, and return its step (None for a
    run with no checkpoint). When ``latest`` is damaged, ``say`` a warning naming the damaged file
    and the step resumed from; ``latest`` is moved back to that step, and each damaged folder
    after it is kept aside as ``step_N.damaged`` (the steps are trained again; the user may
    restore a file from it). CheckpointError, in one line naming the damaged file, when none is
    intact; RefusedCheckpoint for a file that names code."""
    from bloomline.io import write_bytes_atomic

    latest = run.latest_step()
    if latest is None:
        return None
    problem = damage(run.step_dir(latest))
    if problem is None:
        return latest
    for step in reversed([s for s in run.complete_steps() if s < latest]):
        if damage(run.step_dir(step)) is None:
            write_bytes_atomic(run.latest_file, step_dir_name(step).encode())
            aside = [_set_aside(run.step_dir(s)) for s in run.complete_steps() if s > step]
            say(
                f"{problem}; resuming from {step_dir_name(step)}, the newest intact checkpoint (the steps after "
                f"it are trained again; {', '.join(aside)} kept aside)"
            )
            return step
    raise CheckpointError(
        f"{problem}; no earlier checkpoint of {run.root} is intact to resume from: restore the file, or train "
        f"into another --out"
    )


def _set_aside(step_dir: Path) -> str:
    """Rename a damaged checkpoint folder out of the run's way (nothing prunes or reads it); its new name."""
    n, target = 1, step_dir.with_name(step_dir.name + ".damaged")
    while target.exists():
        n += 1
        target = step_dir.with_name(f"{step_dir.name}.damaged-{n}")
    step_dir.rename(target)
    return target.name
