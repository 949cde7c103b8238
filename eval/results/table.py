"""Contract 3: the evaluation results of a run (``eval/RESULTS.md``).

An append-only Parquet dataset, ``RUN_DIR/eval/results/step_NNNNNNNN.parquet``: one file per
evaluated checkpoint, written to a temporary name and renamed, so a killed evaluation leaves no
half-written rows and re-evaluating a checkpoint replaces its rows instead of adding duplicates.
Generations go the same way to ``RUN_DIR/eval/generations/``. :func:`read_results` checks every
file's schema and version at load time; plain pyarrow, pandas or DuckDB read the folder as is.
The rows' shapes and the validation task's wide view of them: eval/results/rows.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bloomline.errors import BloomlineError
from bloomline.io import remove_stale_tmp, tmp_path, write_bytes_atomic
from bloomline.secrets import mask_text
from eval.results.rows import long_rows
from training.checkpoint.run_dir import RunDir

RESULTS_VERSION = 4
READS = (1, 2, 3, 4)
"""Results versions :func:`read_results` reads: version 1's wide rows become long ones, versions 1
and 2 get a null ``epochs_seen``, versions 1 to 3 the ``eval_layout`` every evaluation then had
(:data:`BEFORE_LAYOUTS`)."""
BEFORE_LAYOUTS = "tp=1 pp=1 device=cpu"
"""The ``eval_layout`` of every evaluation written before version 4: one process on the CPU."""
VERSION_KEY = b"bloomline.results_version"

SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("step", pa.int64()),
        ("checkpoint", pa.string()),
        ("task", pa.string()),
        ("scope", pa.string()),
        ("lang", pa.string()),
        ("family", pa.string()),
        ("weighting", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("stderr", pa.float64()),
        ("n", pa.int64()),
        ("note", pa.string()),
        ("tokens_seen", pa.int64()),
        ("epochs_seen", pa.float64()),
        ("precision", pa.string()),
        ("layout", pa.string()),
        ("eval_layout", pa.string()),
        ("data_manifest_sha256", pa.string()),
        ("evaluated_at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={VERSION_KEY: str(RESULTS_VERSION).encode()},
)
"""Version 4: one row per (step, task, scope, lang, weighting, metric) (eval/RESULTS.md)."""

SCHEMA_V3 = pa.schema([f for f in SCHEMA if f.name != "eval_layout"], metadata={VERSION_KEY: b"3"})
"""Version 3: version 4 without ``eval_layout``."""

SCHEMA_V2 = pa.schema([f for f in SCHEMA_V3 if f.name != "epochs_seen"], metadata={VERSION_KEY: b"2"})
"""Version 2: version 3 without ``epochs_seen``."""

SCHEMA_V1 = pa.schema(
    [
        ("run", pa.string()),
        ("step", pa.int64()),
        ("checkpoint", pa.string()),
        ("scope", pa.string()),
        ("lang", pa.string()),
        ("family", pa.string()),
        ("weighting", pa.string()),
        ("loss", pa.float64()),
        ("ppl", pa.float64()),
        ("bpb", pa.float64()),
        ("tokens", pa.int64()),
        ("bytes", pa.int64()),
        ("docs", pa.int64()),
        ("tokens_seen", pa.int64()),
        ("precision", pa.string()),
        ("layout", pa.string()),
        ("data_manifest_sha256", pa.string()),
        ("evaluated_at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={VERSION_KEY: b"1"},
)
"""Version 1 (wide: one row per language or aggregate, the validation task's columns)."""

GENERATIONS_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("step", pa.int64()),
        ("lang", pa.string()),
        ("k", pa.int64()),
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("precision", pa.string()),
        ("evaluated_at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={VERSION_KEY: str(RESULTS_VERSION).encode()},
)


class ResultsError(BloomlineError):
    """A results file of another schema or version, or unreadable."""


def results_dir(run_dir: str | Path) -> Path:
    return RunDir(run_dir).results


def generations_dir(run_dir: str | Path) -> Path:
    return RunDir(run_dir).generations


def _write(folder: Path, step: int, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(folder)  # what a killed evaluation left
    path = folder / f"step_{step:08d}.parquet"
    tmp = tmp_path(path)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, path)
    return path


def write_results(
    run_dir: str | Path, step: int, rows: list[dict[str, Any]], generations: list[dict[str, Any]]
) -> Path:
    """Publish one checkpoint's rows (replacing any earlier evaluation of it); generations first,
    so a results file never exists without its generations."""
    _write(generations_dir(run_dir), step, generations, GENERATIONS_SCHEMA)
    return _write(results_dir(run_dir), step, rows, SCHEMA)


def _read(folder: Path, schema: pa.Schema, versions: dict[str, Any]) -> pa.Table:
    """Every ``step_*.parquet`` of ``folder``, checked: a version it reads (``versions``: version
    → (its schema, how its table becomes ``schema``'s)), and that version's columns."""
    tables = []
    for f in sorted(folder.glob("step_*.parquet")) if folder.is_dir() else []:
        try:
            found = pq.read_schema(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise ResultsError(f"{f}: not a readable Parquet file ({e})") from None
        version = (found.metadata or {}).get(VERSION_KEY, b"").decode()
        if version not in versions:
            raise ResultsError(
                f"{f}: results version {version or 'missing'}, this bloomline reads "
                f"{', '.join(versions)} (eval/RESULTS.md)"
            )
        want, convert = versions[version]
        if not found.remove_metadata().equals(want.remove_metadata()):
            w = {n: str(t) for n, t in zip(want.names, want.types)}
            got = {n: str(t) for n, t in zip(found.names, found.types)}
            diff = sorted(set(w.items()) ^ set(got.items()))[:4]
            raise ResultsError(
                f"{f}: not the results schema (version {version}) of eval/RESULTS.md (columns differ: {diff})"
            )
        tables.append(convert(pq.read_table(f, schema=want)))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _v3_to_v4(t: pa.Table) -> pa.Table:
    at = SCHEMA.get_field_index("eval_layout")
    column = pa.array([BEFORE_LAYOUTS] * len(t), pa.string())
    return t.add_column(at, SCHEMA.field(at), column).replace_schema_metadata(SCHEMA.metadata)


def _v1_to_v4(t: pa.Table) -> pa.Table:
    rows = [{**r, "eval_layout": BEFORE_LAYOUTS} for r in long_rows(t.to_pylist())]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _v2_to_v4(t: pa.Table) -> pa.Table:
    at = SCHEMA_V3.get_field_index("epochs_seen")
    v3 = t.add_column(at, SCHEMA_V3.field(at), pa.nulls(len(t), pa.float64()))
    return _v3_to_v4(v3)


def read_results(run_dir: str | Path) -> pa.Table:
    """Every evaluation of the run in version 4's long form (versions 1 to 3 converted), checked
    file by file; empty (with the schema) when there is none. The one reader of contract 3."""
    versions = {
        "4": (SCHEMA, lambda t: t),
        "3": (SCHEMA_V3, _v3_to_v4),
        "2": (SCHEMA_V2, _v2_to_v4),
        "1": (SCHEMA_V1, _v1_to_v4),
    }
    return _read(results_dir(run_dir), SCHEMA, versions)


def read_generations(run_dir: str | Path) -> pa.Table:
    same = (GENERATIONS_SCHEMA, lambda t: t)  # unchanged from version 1 to 4
    return _read(generations_dir(run_dir), GENERATIONS_SCHEMA, {v: same for v in ("1", "2", "3", "4")})


def evaluated_steps(run_dir: str | Path) -> list[int]:
    """Steps with published results."""
    folder = results_dir(run_dir)
    return sorted(int(p.stem[5:]) for p in folder.glob("step_*.parquet")) if folder.is_dir() else []


def skipped_file(run_dir: str | Path) -> Path:
    return RunDir(run_dir).skipped


def record_skipped(run_dir: str | Path, step: int, reason: str) -> None:
    """Record that checkpoint ``step`` will not be evaluated, and why (one JSON line, appended);
    ``reason``, which may quote an exception, with its secrets masked (the file is shown and shared)."""
    import datetime as dt
    import json

    f = skipped_file(run_dir)
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f, "a", encoding="utf-8") as out:
        out.write(
            json.dumps(
                {
                    "step": step,
                    "reason": mask_text(reason),
                    "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                }
            )
            + "\n"
        )
        out.flush()
        os.fsync(out.fileno())


def skipped_steps(run_dir: str | Path) -> dict[int, str]:
    """Checkpoints recorded as not evaluated, with the reason."""
    import json

    f = skipped_file(run_dir)
    out = {}
    for line in f.read_text(encoding="utf-8").splitlines() if f.exists() else []:
        try:
            rec = json.loads(line)
            out[int(rec["step"])] = rec["reason"]
        except (ValueError, KeyError):
            pass  # a line cut off by a kill
    return out


def settled(run_dir: str | Path) -> set[int]:
    """Checkpoints evaluated, or recorded as skipped: none of them is waiting for an evaluation."""
    return set(evaluated_steps(run_dir)) | set(skipped_steps(run_dir))


def forget_after(run_dir: str | Path, step: int) -> list[int]:
    """Remove the evaluations (results, generations, skipped records) of checkpoints after ``step``;
    the steps they were of."""
    import json

    gone = set()
    for folder in (results_dir(run_dir), generations_dir(run_dir)):
        for f in folder.glob("step_*.parquet") if folder.is_dir() else []:
            if int(f.stem[5:]) > step:
                f.unlink()
                gone.add(int(f.stem[5:]))
    f = skipped_file(run_dir)
    if f.exists():
        kept = []
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                if int(json.loads(line)["step"]) > step:
                    gone.add(int(json.loads(line)["step"]))
                    continue
            except (ValueError, KeyError, TypeError):
                continue  # a line cut off by a kill
            kept.append(line + "\n")
        write_bytes_atomic(f, "".join(kept).encode("utf-8"))
    return sorted(gone)


EVALUATION_PARTS = ("results", "generations", "skipped")  # what evaluations of a run leave (RunDir's names)


def clear_evaluations(run_dir: str | Path) -> None:
    """Remove the run's evaluations (results, generations, the skipped list)."""
    folder = RunDir(run_dir)
    for part in EVALUATION_PARTS:
        path = getattr(folder, part)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def copy_evaluations(src_run: str | Path, dst_run: str | Path) -> None:
    """Make run ``dst_run``'s evaluations (results, generations, the skipped list) a copy of
    ``src_run``'s, replacing what it had: how the main job keeps and restores the evaluations of
    each set of evaluation settings (flows/stages/pipeline.py)."""
    clear_evaluations(dst_run)
    src, dst = RunDir(src_run), RunDir(dst_run)
    for part in EVALUATION_PARTS:
        a, b = getattr(src, part), getattr(dst, part)
        if a.is_dir():
            shutil.copytree(a, b)
        elif a.is_file():
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)
