"""The reference run of an online mixture steered by evaluations (``batch.online.reference``,
DoReMi's reference model): its per-language bits per byte against tokens seen, read from its
results table (contract 3), after checking that it can be compared with this run at all.

Comparable means: the same languages, the same tokenizer (tokens seen are counted in its
tokens: doremi#18 is what another tokenizer does to transferred weights), and the same
validation data (a reference validated on other samples is another yardstick: doremi#20).
Each mismatch stops the run before any rank starts, with one line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomline.errors import ConfigError
from bloomline.io import read_json
from data_prep.storage.data_cache import prepared
from data_prep.storage.shards import load_manifest
from eval.results.rows import of_languages, validation_rows
from eval.results.table import read_results
from training.checkpoint.meta import read_meta
from training.checkpoint.run_dir import RunDir
from training.data.mixture.controller import ReferenceCurve

KEY = "batch.online.reference"


def _reference_tokenizer(ref: RunDir) -> str:
    """The sha256 of the tokenizer the reference run trained with (its data's manifest)."""
    step = ref.latest_step()
    if step is None:
        raise ConfigError(KEY, f"{ref.root} has no checkpoint: is it a bloomline run folder?")
    data_dir = prepared(read_meta(ref.step_dir(step))["data_dir"])  # a URL: this node's cache of it
    if not (data_dir / "manifest.json").is_file():
        raise ConfigError(KEY, f"the reference run's data {data_dir} is gone: its tokenizer cannot be checked")
    return load_manifest(data_dir)["tokenizer"]["sha256"]


def reference_curve(
    ref_dir: str | Path, data_dir: str | Path, languages: list[str]
) -> tuple[ReferenceCurve, dict[str, Any]]:
    """The reference run's curve for this run's ``languages`` on ``data_dir``, and what was checked."""
    ref = RunDir(Path(ref_dir).resolve())
    if not ref.results.is_dir():
        raise ConfigError(KEY, f"{ref.root} has no evaluation results ({ref.results})")
    rows = of_languages(validation_rows(read_results(ref.root)))
    if not rows:
        raise ConfigError(KEY, f"{ref.results} holds no per-language results")
    theirs = sorted({r["lang"] for r in rows})
    if theirs != sorted(languages):
        only_ref, only_us = sorted(set(theirs) - set(languages)), sorted(set(languages) - set(theirs))
        raise ConfigError(
            KEY,
            f"the reference run {ref.root.name} has other languages than this run"
            + (f"; only the reference: {only_ref}" if only_ref else "")
            + (f"; only this run: {only_us}" if only_us else ""),
        )
    manifest = load_manifest(data_dir)
    ours = manifest["tokenizer"]["sha256"]
    if (tok := _reference_tokenizer(ref)) != ours:
        raise ConfigError(
            KEY,
            f"the reference run {ref.root.name} used another tokenizer (sha256 {tok[:12]}…, this "
            f"data's is {ours[:12]}…): its tokens seen do not compare with this run's",
        )
    stamp = ref.eval_stamp
    # the validation shards the reference's evaluations checked (eval/RESULTS.md, data_verified.json)
    theirs_valid = {p: v[2] for p, v in (read_json(stamp)["shards"] if stamp.is_file() else {}).items()}
    ours_valid = {s["path"]: s["sha256"] for s in manifest["shards"] if s["split"] == "valid"}
    if theirs_valid != ours_valid:
        differ = sorted(p for p in ours_valid.keys() | theirs_valid.keys() if ours_valid.get(p) != theirs_valid.get(p))
        raise ConfigError(
            KEY,
            f"the reference run {ref.root.name} was validated on other data than {data_dir}: "
            f"validation shard {differ[0]} differs" + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""),
        )
    points: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(rows, key=lambda r: (r["lang"], r["tokens_seen"], r["step"])):
        points.setdefault(r["lang"], []).append((int(r["tokens_seen"]), float(r["bpb"])))
    checked = {
        "languages": len(theirs),
        "tokenizer_sha256": ours,
        "validation_shards": len(ours_valid),
        "evaluations": len({r["step"] for r in rows}),
    }
    return ReferenceCurve(ref.root.name, points), checked
